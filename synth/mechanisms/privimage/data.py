"""Bring sensitive and public images to one model format: size x size, the sensitive set's
channels."""

from __future__ import annotations

import numpy as np
import torch

from accounting.errors import InvalidParameterError
from synth.kinds.datasets import ImageDataset
from synth.kinds.datasets import to_format as to_format


def channels_of(ds: ImageDataset) -> int:
    return 1 if ds.images.ndim == 3 else int(ds.images.shape[-1])


def to_tensor(images_uint8: np.ndarray) -> torch.Tensor:
    """uint8 (N,H,W[,C]) -> float32 (N,C,H,W) in [-1, 1]."""
    x = torch.from_numpy(images_uint8.astype(np.float32) / 127.5 - 1.0)
    return x[:, None] if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """float (N,C,H,W) in [-1, 1] -> uint8 (N,H,W) for grey or (N,H,W,C)."""
    arr = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
    return arr[:, 0] if arr.shape[1] == 1 else np.moveaxis(arr, 1, -1)


def label_index(labels: np.ndarray, label_values: list[int]) -> np.ndarray:
    """Map label values to 0..C-1 positions in label_values; unknown labels are an error."""
    lookup = {v: i for i, v in enumerate(label_values)}
    try:
        return np.array([lookup[int(v)] for v in labels], dtype=np.int64)
    except KeyError as exc:
        raise InvalidParameterError(
            f"Label {exc.args[0]} is not one of the model's classes {label_values}."
        ) from None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidParameterError(
            f"device {name!r} requested but CUDA is not available; use device='auto' or 'cpu'."
        )
    return torch.device(name)
