"""The whole of DP-MERF on one image set, shared by the `merf` mechanism and PrivImage's frequency
warm-up: the one noisy query, then the generator trained against it."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from synth.progress import ProgressFn, no_progress
from synth.tools.kernel.embedding import (
    FeatureMap,
    NoisyEmbedding,
    as_feature_map,
    features,
    frequencies,
    noised,
    noisy_embedding,
)
from synth.tools.kernel.generator import ConditionalGenerator, draw, train_generator


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
    perceptual_share: float = 0.0  # the perceptual features' share of each record's unit norm


# A class whose generated images lie this many times further from its (noisy) target embedding
# than the median class's has collapsed: the limit sits between collapsed classes and healthy ones
# (BENCHMARKS-NOTEBOOK.md, "DP-MERF's kernel bandwidth", its second run).
COLLAPSE_RATIO = 2.5
# A class whose generated images' mean feature lies this far from its target, relative to the
# target's norm, matches none of it, whatever the other classes do: this catches a generator that
# drew noise for every class, which the ratio to the median cannot see (BENCHMARKS-NOTEBOOK.md,
# "DP labels for DP-MERF", its second epsilon-10 run).
COLLAPSE_DISTANCE = 0.9
GENERATOR_ATTEMPTS = 3  # after a collapse: a fresh generator (another initialisation), best kept
CHECK_PER_CLASS = 500  # images drawn per class for the check


@dataclass
class FittedMerf:
    """What the query and the training produced: all of it is DP (post-processing of the query)."""

    generator: ConditionalGenerator
    frequencies: torch.Tensor
    embedding: NoisyEmbedding
    size: int  # the generator's square image size (a multiple of 4)
    attempts: int = 1  # generators trained (more than one after a collapsed class)
    distances: np.ndarray | None = None  # the kept generator's class_distances
    collapsed: tuple[int, ...] = ()  # classes the kept generator still leaves collapsed, if any

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


# an extra collapse check on a trained generator: the class positions it finds collapsed
CollapseCheck = Callable[[ConditionalGenerator], list[int]]


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
    also_collapsed: CollapseCheck | None = None,
    exact_sums: Callable[[FeatureMap], np.ndarray] | None = None,
) -> FittedMerf:
    """The noisy embedding of `images` (sensitive: uint8, class positions `rows`) with noise std
    `sigma`, and a generator trained against it. `exact_sums(feature_map)`: the query's un-noised
    matrix under this feature map, computed elsewhere (DP-MERF's run maps it over chunks on the
    runner's workers); the noise is added here, once, to the total."""
    size = generator_size(*np.asarray(images).shape[1:3])
    channels = 1 if np.asarray(images).ndim == 3 else int(np.asarray(images).shape[-1])
    fmap = feature_map(channels * size * size, s)
    progress("DP-MERF embedding (one Gaussian query)", 0, 1)
    if exact_sums is None:
        emb = noisy_embedding(ImageChunks(images, size), rows, n_classes, fmap, sigma)
    else:
        emb = noised(exact_sums(fmap), sigma, len(images))
    progress("DP-MERF embedding (one Gaussian query)", 1, 1)
    return train_fitted(
        emb, fmap, n_classes, size, channels, s, progress, also_collapsed=also_collapsed
    )


def feature_map(n_pixels: int, s: MerfSettings) -> FeatureMap:
    """The query's feature map: frequencies from the settings' public seed (every process that
    computes a share of the query builds the same one)."""
    return FeatureMap(frequencies(n_pixels, s.n_features, s.bandwidth, s.seed), s.perceptual_share)


def train_fitted(
    emb: NoisyEmbedding,
    w: torch.Tensor | FeatureMap,
    n_classes: int,
    size: int,
    channels: int,
    s: MerfSettings,
    progress: ProgressFn = no_progress,
    stage: str = "DP-MERF generator",
    also_collapsed: CollapseCheck | None = None,
) -> FittedMerf:
    """A generator trained against an already drawn noisy embedding (post-processing only). A
    generator that left a class collapsed (collapsed_classes, or `also_collapsed`: a check that
    must itself be post-processing, e.g. of a DP classifier) is trained again from another
    initialisation, up to GENERATOR_ATTEMPTS in all. Kept: the one with the fewest collapsed
    classes, then whose worst class lies closest to its target (relative to the median class).
    `w`: the query's FeatureMap, or its frequencies alone (pixel features)."""
    fmap = as_feature_map(w)
    best: tuple[tuple[int, float], ConditionalGenerator, np.ndarray, list[int]] | None = None
    attempt = 0
    for attempt in range(1, GENERATOR_ATTEMPTS + 1):
        seed = s.seed + attempt - 1  # the first attempt is the generator a single training made
        label = stage if attempt == 1 else f"{stage} (again: a class collapsed)"
        torch.manual_seed(seed)
        gen = ConditionalGenerator(n_classes, size, channels, z_dim=s.z_dim, width=s.width)
        train_generator(
            gen,
            emb,
            fmap,
            steps=s.steps,
            batch=s.batch,
            lr=s.lr,
            seed=seed,
            progress=functools.partial(progress, label),
        )
        d = class_distances(gen, emb, fmap, size, seed=s.seed + 2)
        worst = float(d.max() / max(float(np.median(d)), 1e-12))
        collapsed = set(collapsed_classes(d))
        if also_collapsed is not None:
            collapsed |= set(also_collapsed(gen))
        rank = (len(collapsed), worst)
        if best is None or rank < best[0]:
            best = (rank, gen, d, sorted(collapsed))
        if not collapsed:
            break
    assert best is not None
    return FittedMerf(
        best[1], fmap.w, emb, size, attempts=attempt, distances=best[2], collapsed=tuple(best[3])
    )


def class_distances(
    gen: ConditionalGenerator,
    emb: NoisyEmbedding,
    w: torch.Tensor | FeatureMap,
    size: int,
    seed: int,
    per_class: int = CHECK_PER_CLASS,
) -> np.ndarray:
    """Per class: the distance from the mean pixel feature of `per_class` generated images to the
    class's noisy mean embedding (noisy sum over noisy count), over that target's norm. Pixel
    features only, with or without perceptual ones beside them: the thresholds were measured so."""
    fmap = as_feature_map(w)
    n_classes = emb.sums.shape[0]
    sums = torch.from_numpy(emb.sums / np.maximum(emb.counts, 1.0)[:, None]).float()
    target = fmap.pixel_part(sums)
    images = draw(gen, np.repeat(np.arange(n_classes), per_class), seed)
    phi = features(to_unit(images, size).flatten(1), fmap.w)
    means = phi.view(n_classes, per_class, -1).mean(1)
    return ((means - target).norm(dim=1) / target.norm(dim=1).clamp_min(1e-12)).numpy()


def collapsed_classes(distances: np.ndarray) -> list[int]:
    """The class positions whose distance exceeds COLLAPSE_RATIO times the median class's, or
    COLLAPSE_DISTANCE."""
    limit = min(COLLAPSE_RATIO * float(np.median(distances)), COLLAPSE_DISTANCE)
    return [int(c) for c in np.flatnonzero(distances > limit)]


class ImageChunks:
    """The images as [0, 1] floats at the generator's size, converted a chunk at a time (a 60,000-
    image set as float would be ~190 MB; noisy_embedding reads it in chunks)."""

    def __init__(self, images: np.ndarray, size: int) -> None:
        self.images, self.size = np.asarray(images), size

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, item: slice) -> torch.Tensor:
        return to_unit(self.images[item], self.size)
