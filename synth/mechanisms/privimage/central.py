"""DP central images (DP-FETA's "easy to hard" warm-up, Li et al., S&P 2025): per sensitive class, a
noisy mean of its (augmented) images, on which the diffusion model is pre-trained before DP-SGD.

The mechanism, one query: every image is taken at half resolution with pixels in [0, 1], clipped to
L2 norm `clip`, and contributes the vector (image / clip, 1) to its class's (sum, count). Adding or
removing one image changes one class's vector by at most sqrt(2) in L2, so the noisy sums and the
noisy counts are released together as one Gaussian query of L2 sensitivity sqrt(2) with noise std
`noise_multiplier` * sqrt(2) in every coordinate (the sums' noise, back in pixel units, has std
noise_multiplier * sqrt(2) * clip). The class counts are not public: they are released only as these
noisy counts, and the mean is the noisy sum over the noisy count (post-processing). `queries`
repeats the query on independently augmented copies (a GaussianQuery of that count); the
augmentation's randomness is independent of the data."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from accounting.events import GaussianQuery
from synth.mechanisms.privimage.augment import augment_public
from synth.mechanisms.privimage.config import CENTRAL_AUTO

# in the run's workdir: the DP central images, reused by a resumed run (never re-queried)
CENTRAL = "central.npz"
SENSITIVITY = math.sqrt(2.0)
# central_images = "auto": AUTO_QUERIES central images per class where the noise on their pixels
# is at most AUTO_MAX_PIXEL_NOISE of the pixel range, else none: noise 0.019 and 0.11 helped at
# epsilon 1, 0.28 wrecked the samples (BENCHMARKS-NOTEBOOK.md, "DP central images at full scale").
AUTO_QUERIES = 2
AUTO_MAX_PIXEL_NOISE = 0.15


def pixel_noise_std(noise_multiplier: float, clip: float, class_size: float) -> float:
    """The noise std on a central image's pixels (pixel range 1) for a class of `class_size`."""
    return noise_multiplier * SENSITIVITY * clip / max(class_size, 1.0)


def resolve_queries(
    setting: int | str, noise_multiplier: float, clip: float, record_count: int, n_classes: int
) -> int:
    """How many central images per class a release makes: `setting` itself, or for "auto" a
    decision from public metadata only (the record count and the number of classes, both part of
    the registration), never from the class sizes, which are private."""
    if setting != CENTRAL_AUTO:
        return int(setting)
    noise = pixel_noise_std(noise_multiplier, clip, record_count / max(n_classes, 1))
    return AUTO_QUERIES if noise <= AUTO_MAX_PIXEL_NOISE else 0


def central_event(noise_multiplier: float, queries: int) -> GaussianQuery:
    return GaussianQuery(
        sigma=noise_multiplier * SENSITIVITY, sensitivity=SENSITIVITY, count=queries
    )


def _half_res_01(x: torch.Tensor) -> torch.Tensor:
    """(N,C,H,W) in [-1, 1] -> (N, C*(H/2)*(W/2)) in [0, 1]."""
    return F.avg_pool2d((x + 1) / 2, 2, ceil_mode=True).flatten(1)


def clipped(v: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row scaled down to L2 norm at most `clip` (rows already within it are unchanged)."""
    norms = v.norm(dim=1, keepdim=True)
    return v * (clip / norms.clamp_min(clip))


def noisy_class_means(
    x: torch.Tensor,
    rows: np.ndarray,
    n_rows: int,
    *,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    chunk: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """One query: (means (n_rows, D) in [0, 1], noisy counts (n_rows,)) from images x (N,C,H,W) in
    [-1, 1]."""
    c, h, w = x.shape[1:]
    sums = np.zeros((n_rows, c * math.ceil(h / 2) * math.ceil(w / 2)))  # as _half_res_01's output
    for i in range(0, len(x), chunk):
        v = clipped(_half_res_01(x[i : i + chunk].float()), clip).double().numpy() / clip
        np.add.at(sums, rows[i : i + chunk], v)
    counts = np.bincount(rows, minlength=n_rows).astype(np.float64)
    std = noise_multiplier * SENSITIVITY
    noisy_sums = (sums + rng.normal(0.0, std, size=sums.shape)) * clip
    noisy_counts = counts + rng.normal(0.0, std, size=counts.shape)
    return np.clip(noisy_sums / np.maximum(noisy_counts, 1.0)[:, None], 0.0, 1.0), noisy_counts


def central_images(
    x: torch.Tensor,
    rows: np.ndarray,
    n_rows: int,
    *,
    queries: int,
    clip: float,
    noise_multiplier: float,
    seed: int,
    augment: float,
) -> tuple[np.ndarray, np.ndarray]:
    """`queries` noisy means per class, each over a freshly augmented copy of the images (the first
    over the images as they are): (images (queries * n_rows, C, H, W) in [-1, 1] at full resolution,
    their rows)."""
    rng = np.random.default_rng()  # OS entropy: the noise must not be reproducible from the config
    gen = torch.Generator().manual_seed(seed)
    c, h, w = x.shape[1:]
    out, labels = [], []
    for q in range(queries):
        xa = (
            x
            if q == 0
            else torch.cat(
                [augment_public(x[i : i + 4096], gen, augment) for i in range(0, len(x), 4096)]
            )
        )
        means, _ = noisy_class_means(
            xa, rows, n_rows, clip=clip, noise_multiplier=noise_multiplier, rng=rng
        )
        half = torch.from_numpy(means).float().view(n_rows, c, -(-h // 2), -(-w // 2))
        full = F.interpolate(half, size=(h, w), mode="bilinear", align_corners=False)
        out.append((full * 2 - 1).clamp(-1, 1).numpy())
        labels.append(np.arange(n_rows))
    return np.concatenate(out), np.concatenate(labels)


def save(workdir: Path, images: np.ndarray, labels: np.ndarray) -> None:
    path, tmp = Path(workdir) / CENTRAL, Path(workdir) / (CENTRAL + ".tmp.npz")
    np.savez(tmp, images=images, labels=labels)
    os.replace(tmp, path)


def load(workdir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    path = Path(workdir) / CENTRAL
    if not path.exists():
        return None
    with np.load(path) as f:
        return f["images"], f["labels"]
