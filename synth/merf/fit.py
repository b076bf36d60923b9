"""The whole of DP-MERF on one image set, shared by the `merf` mechanism and PrivImage's frequency
warm-up: the one noisy query, then the generator trained against it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from synth.merf.embedding import NoisyEmbedding, frequencies, noisy_embedding
from synth.merf.generator import ConditionalGenerator, draw, train_generator
from synth.progress import ProgressFn, no_progress


@dataclass(frozen=True)
class MerfSettings:
    n_features: int
    bandwidth: float
    z_dim: int
    width: int
    steps: int
    batch: int
    lr: float
    seed: int


@dataclass
class FittedMerf:
    """What the query and the training produced: all of it is DP (post-processing of the query)."""

    generator: ConditionalGenerator
    frequencies: torch.Tensor
    embedding: NoisyEmbedding
    size: int  # the generator's square image size (a multiple of 4)

    def draw(self, rows: np.ndarray, seed: int, out_size: tuple[int, int]) -> np.ndarray:
        """uint8 images (N, H, W[, C]) at `out_size` for class positions `rows`."""
        images = draw(self.generator, rows, seed)
        if images.shape[1:3] == tuple(out_size):
            return images
        x = torch.from_numpy(images).float()
        x = x[:, None] if x.ndim == 3 else x.permute(0, 3, 1, 2)
        x = F.interpolate(x, size=out_size, mode="bilinear", align_corners=False)
        out = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
        return out[..., 0] if out.shape[-1] == 1 else out


def generator_size(height: int, width: int) -> int:
    """The generator's square size for images of height x width: the next multiple of 4."""
    return 4 * math.ceil(max(height, width) / 4)


def to_unit(images: np.ndarray, size: int) -> torch.Tensor:
    """uint8 (N, H, W[, C]) -> float (N, C, size, size) in [0, 1]."""
    x = torch.from_numpy(np.asarray(images)).float().div_(255)
    x = x[:, None] if x.ndim == 3 else x.permute(0, 3, 1, 2)
    if x.shape[2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x


def fit(
    images: np.ndarray,
    rows: np.ndarray,
    n_classes: int,
    sigma: float,
    s: MerfSettings,
    progress: ProgressFn = no_progress,
    stage: str = "DP-MERF generator",
) -> FittedMerf:
    """The noisy embedding of `images` (sensitive: uint8, class positions `rows`) with noise std
    `sigma`, and a generator trained against it."""
    size = generator_size(*np.asarray(images).shape[1:3])
    channels = 1 if np.asarray(images).ndim == 3 else int(np.asarray(images).shape[-1])
    w = frequencies(channels * size * size, s.n_features, s.bandwidth, s.seed)
    progress("DP-MERF embedding (one Gaussian query)", 0, 1)
    emb = noisy_embedding(ImageChunks(images, size), rows, n_classes, w, sigma)
    progress("DP-MERF embedding (one Gaussian query)", 1, 1)
    return train_fitted(emb, w, n_classes, size, channels, s, progress, stage)


def train_fitted(
    emb: NoisyEmbedding,
    w: torch.Tensor,
    n_classes: int,
    size: int,
    channels: int,
    s: MerfSettings,
    progress: ProgressFn = no_progress,
    stage: str = "DP-MERF generator",
) -> FittedMerf:
    """A generator trained against an already drawn noisy embedding (post-processing only)."""
    torch.manual_seed(s.seed)
    gen = ConditionalGenerator(n_classes, size, channels, z_dim=s.z_dim, width=s.width)
    train_generator(
        gen,
        emb,
        w,
        steps=s.steps,
        batch=s.batch,
        lr=s.lr,
        seed=s.seed,
        progress=lambda done, total: progress(stage, done, total),
    )
    return FittedMerf(gen, w, emb, size)


class ImageChunks:
    """The images as [0, 1] floats at the generator's size, converted a chunk at a time (a 60,000-
    image set as float would be ~190 MB; noisy_embedding reads it in chunks)."""

    def __init__(self, images: np.ndarray, size: int) -> None:
        self.images, self.size = np.asarray(images), size

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, item: slice) -> torch.Tensor:
        return to_unit(self.images[item], self.size)
