"""FETA-Pro's frequency warm-up (Li et al., USENIX Security 2026): before the central images and
DP-SGD, the diffusion model pre-trains on images of a DP-MERF generator (synth.mechanisms.merf),
trained on the
publisher's machine against one noisy random-feature embedding of each sensitive class.

The privacy cost is that one Gaussian query of L2 sensitivity 1 (synth.tools.kernel.embedding),
charged as
its own event in the plan; the generator and its images are post-processing. The noisy embedding is
saved in the run's workdir the moment it is drawn, so a resumed run trains on the same answer and
never asks the query again."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from accounting.events import GaussianQuery
from synth.mechanisms.privimage.config import FREQUENCY_AUTO
from synth.progress import ProgressFn
from synth.tools.kernel.embedding import SENSITIVITY, NoisyEmbedding, embedding_event, frequencies
from synth.tools.kernel.embedding import noisy_embedding as draw_embedding
from synth.tools.kernel.fit import (
    FittedMerf,
    ImageChunks,
    MerfSettings,
    generator_size,
    to_unit,
    train_fitted,
)

EMBEDDING = "frequency_embedding.npz"  # in the run's workdir: the noisy answer, never re-queried
IMAGES = "frequency_images.npz"  # the generator's images (post-processing), for a resumed run
# frequency_warmup = "auto": on where the noise on a class's mean embedding, as a share of the
# largest norm that embedding can have (1), is at most this: sigma * sqrt(features) / class size.
# Measured (BENCHMARKS-NOTEBOOK.md, "Frequency warm-up"): Fashion-MNIST (5,500 a class, 0.31 at the
# defaults) gains; MNIST-5k (400 a class, 4.2) would pre-train on noise.
AUTO_MAX_NOISE = 0.5


def noise_share(sigma: float, n_features: int, class_size: float) -> float:
    """The noise norm on one class's mean embedding over the largest norm the mean can have."""
    return sigma * math.sqrt(n_features) / max(class_size, 1.0)


def resolve_frequency(
    setting: bool | str, sigma: float, n_features: int, record_count: int, n_classes: int
) -> bool:
    """Whether a release runs the warm-up: `setting` itself, or for "auto" a decision from public
    metadata only (the record count and the number of classes)."""
    if setting != FREQUENCY_AUTO:
        return bool(setting)
    return noise_share(sigma, n_features, record_count / max(n_classes, 1)) <= AUTO_MAX_NOISE


def frequency_event(sigma: float) -> GaussianQuery:
    """The embedding query as charged: noise std = `sigma` x sensitivity 1."""
    return embedding_event(sigma * SENSITIVITY)


def _save_embedding(workdir: Path, emb: NoisyEmbedding) -> None:
    path, tmp = workdir / EMBEDDING, workdir / (EMBEDDING + ".tmp.npz")
    np.savez(tmp, sums=emb.sums, counts=emb.counts, n_records=emb.n_records)
    with open(tmp, "rb") as fh:  # durable before anything is trained on it
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _load_embedding(workdir: Path) -> NoisyEmbedding | None:
    path = workdir / EMBEDDING
    if not path.exists():
        return None
    with np.load(path) as f:
        return NoisyEmbedding(f["sums"], f["counts"], int(f["n_records"]))


def warmup_images(
    images: np.ndarray,
    rows: np.ndarray,
    n_classes: int,
    event: GaussianQuery,
    settings: MerfSettings,
    n_images: int,
    workdir: Path,
    progress: ProgressFn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The warm-up's pre-training set: (images (n_images, C, H, W) in [-1, 1], class positions),
    balanced over the classes, at the sensitive images' size. `images` are the sensitive images
    (uint8), `rows` their class positions."""
    saved = workdir / IMAGES
    if saved.exists():
        with np.load(saved) as f:
            return torch.from_numpy(f["images"]), torch.from_numpy(f["labels"])
    h, w = np.asarray(images).shape[1:3]
    channels = 1 if np.asarray(images).ndim == 3 else int(np.asarray(images).shape[-1])
    size = generator_size(h, w)
    freqs = frequencies(
        channels * size * size, settings.n_features, settings.bandwidth, settings.seed
    )
    emb = _load_embedding(workdir)
    if emb is None:
        progress("frequency warm-up: embedding (one Gaussian query)", 0, 1)
        emb = draw_embedding(ImageChunks(images, size), rows, n_classes, freqs, event.sigma)
        _save_embedding(workdir, emb)
        progress("frequency warm-up: embedding (one Gaussian query)", 1, 1)
    fitted: FittedMerf = train_fitted(
        emb, freqs, n_classes, size, channels, settings, progress, "frequency warm-up: generator"
    )
    labels = np.sort(np.arange(n_images) % n_classes)
    x = to_unit(fitted.draw(labels, settings.seed + 1, (h, w)), h) * 2 - 1
    y = torch.from_numpy(labels)
    tmp = workdir / (IMAGES + ".tmp.npz")
    np.savez(tmp, images=x.numpy(), labels=labels)
    os.replace(tmp, saved)
    return x, y
