"""DP-MERF's one query (Harder et al., AISTATS 2021): a random-Fourier-feature mean embedding of
every class, released once with Gaussian noise.

Each image x (pixels in [0, 1], flattened) maps to phi(x) = [cos(W x), sin(W x)] / sqrt(F / 2) with
F / 2 random frequencies W ~ N(0, 1 / bandwidth) (the features of a Gaussian kernel of that
bandwidth, Rahimi & Recht 2007; ||phi(x)|| = 1 exactly). The record (phi(x) * a, b) with
a^2 + b^2 = 1 is added to its class's column, so the columns hold the feature sums and, in the last
row, the class counts scaled by b. Adding or removing one record changes the matrix by a unit vector
in one column: L2 sensitivity 1, one Gaussian query with noise std `sigma` on every entry. The noisy
counts give the class proportions (to draw the generator's labels); both are released only through
this one query. W is drawn from the config's seed: public randomness, independent of the data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from accounting.events import GaussianQuery
from synth.tools.kernel.perceptual import perceptual_features
from synth.tools.secure_noise import SecureGaussian


class ImageRows(Protocol):
    """Images in [0, 1] by row ranges: a tensor, or a view converting a chunk at a time."""

    def __len__(self) -> int: ...

    def __getitem__(self, item: slice) -> torch.Tensor: ...


SENSITIVITY = 1.0
# the count row's weight b: a small share of each record's unit norm (the features keep
# sqrt(1 - b^2) = 0.995 of it); count noise sigma / b stays small next to classes of hundreds
COUNT_WEIGHT = 0.1
FEATURE_WEIGHT = math.sqrt(1.0 - COUNT_WEIGHT**2)


def embedding_event(sigma: float) -> GaussianQuery:
    """The query as the ledger charges it."""
    return GaussianQuery(sigma=sigma, sensitivity=SENSITIVITY, count=1)


def frequencies(
    n_pixels: int, n_features: int, bandwidth: float | Sequence[float], seed: int
) -> torch.Tensor:
    """W: (n_features / 2, n_pixels), N(0, 1 / bandwidth) entries from the public seed. Several
    bandwidths make the features of their mixture kernel (equal weights): row i of W takes
    bandwidth[i % len(bandwidth)]; ||phi(x)|| is still 1, so the sensitivity is unchanged."""
    if n_features < 2 or n_features % 2:
        raise ValueError(f"n_features must be even and >= 2, got {n_features}")
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n_features // 2, n_pixels, generator=gen)
    if isinstance(bandwidth, (int, float)):
        return w / math.sqrt(bandwidth)
    scales = torch.tensor([float(bandwidth[i % len(bandwidth)]) for i in range(len(w))])
    return w * scales.rsqrt()[:, None]


def features(x01: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """phi(x) for rows x (N, n_pixels) in [0, 1]: (N, n_features), each row of norm 1."""
    xw = x01 @ w.t()
    return torch.cat([torch.cos(xw), torch.sin(xw)], dim=1) / math.sqrt(w.shape[0])


class FeatureMap:
    """What one record adds to its class's column of the query: the pixel random features phi(x)
    (frequencies `w`) and, with `perceptual_share` s > 0, [sqrt(1 - s) phi(x), sqrt(s) g(x)]
    with g = perceptual_features. Every row has norm 1, so the query's sensitivity is unchanged."""

    def __init__(self, w: torch.Tensor, perceptual_share: float = 0.0) -> None:
        if not 0.0 <= perceptual_share < 1.0:
            raise ValueError(f"perceptual_share must be in [0, 1), got {perceptual_share}")
        self.w, self.share = w, float(perceptual_share)
        self.n_pixel = 2 * w.shape[0]
        self.pixel_weight = math.sqrt(1.0 - self.share)

    def __call__(self, x01: torch.Tensor) -> torch.Tensor:
        """(N, C, S, S) in [0, 1] -> (N, dim) rows of norm 1."""
        phi = features(x01.flatten(1), self.w)
        if not self.share:
            return phi
        g = perceptual_features(x01)
        return torch.cat([self.pixel_weight * phi, math.sqrt(self.share) * g], dim=1)

    def pixel_part(self, rows: torch.Tensor) -> torch.Tensor:
        """The pixel features' part of rows of this map (or of sums of them), weight undone."""
        return rows[..., : self.n_pixel] / self.pixel_weight


def as_feature_map(w: torch.Tensor | FeatureMap) -> FeatureMap:
    """Frequencies alone are the pixel-only map (PrivImage's warm-up passes them so)."""
    return w if isinstance(w, FeatureMap) else FeatureMap(w)


@dataclass(frozen=True)
class NoisyEmbedding:
    """The released query: per class, the noisy feature sum and the noisy count (weights undone)."""

    sums: np.ndarray  # (n_classes, n_features): noisy sums of phi over each class
    counts: np.ndarray  # (n_classes,): noisy class sizes
    n_records: int  # the dataset's size (public)

    def proportions(self) -> np.ndarray:
        """The noisy class shares, floored at zero and summing to 1 (post-processing)."""
        c = np.maximum(self.counts, 0.0)
        return c / c.sum() if c.sum() > 0 else np.full(len(c), 1.0 / len(c))

    def target(self) -> torch.Tensor:
        """The mean embedding a generator is trained to match: (n_classes, n_features), each class's
        noisy feature sum over the dataset size, as DP-MERF's loss compares it."""
        return torch.from_numpy(self.sums / self.n_records).float()


def class_sums(
    x01: ImageRows,
    rows: np.ndarray,
    n_classes: int,
    w: torch.Tensor | FeatureMap,
    chunk: int = 2048,
) -> np.ndarray:
    """The exact (un-noised) matrix: (n_classes, features + 1) of weighted feature sums and the
    weighted counts in the last column. `w`: the frequencies, or a FeatureMap (rows of norm 1
    either way). Sensitive: never leaves this module without noise."""
    fmap = as_feature_map(w)
    sums: torch.Tensor | None = None
    with torch.no_grad():
        for i in range(0, len(x01), chunk):
            phi = fmap(x01[i : i + chunk].float()).double()
            # rows are unit norm up to float32 rounding: scaled to at most 1 in float64, so the
            # sensitivity holds to double precision
            phi = phi / phi.norm(dim=1, keepdim=True).clamp_min(1.0)
            if sums is None:
                sums = torch.zeros(n_classes, phi.shape[1], dtype=torch.float64)
            idx = torch.from_numpy(np.asarray(rows[i : i + chunk], dtype=np.int64))
            sums.index_add_(0, idx, phi)
    if sums is None:
        raise ValueError("no images to embed")
    out = np.zeros((n_classes, sums.shape[1] + 1))
    out[:, :-1] = sums.numpy() * FEATURE_WEIGHT
    out[:, -1] = np.bincount(rows, minlength=n_classes) * COUNT_WEIGHT
    return out


def noisy_embedding(
    x01: ImageRows, rows: np.ndarray, n_classes: int, w: torch.Tensor | FeatureMap, sigma: float
) -> NoisyEmbedding:
    """The one Gaussian query (noise from the hardened CSPRNG sampler), weights undone."""
    return noised(class_sums(x01, rows, n_classes, w), sigma, len(x01))


def noised(exact: np.ndarray, sigma: float, n_records: int) -> NoisyEmbedding:
    """The query's answer: `exact` (class_sums of all `n_records` records, summed wherever they
    were computed) with Gaussian noise of std `sigma` added once, on the whole matrix."""
    noisy = exact + SecureGaussian().noise(exact.shape, sigma).numpy()
    return NoisyEmbedding(
        sums=noisy[:, :-1] / FEATURE_WEIGHT,
        counts=noisy[:, -1] / COUNT_WEIGHT,
        n_records=n_records,
    )
