"""The kernel's bandwidth rule: how wide a random-feature kernel to use for a query, decided from
the noise its class embeddings will carry (public quantities only: the plan's sigma, the
registered count and label set, so deciding spends no privacy). The merf mechanism and PrivImage's
frequency warm-up both apply it; each limit sits between settings that worked and settings that
collapsed (BENCHMARKS.md, DP-MERF; BENCHMARKS-NOTEBOOK.md, the DP-MERF sections)."""

from __future__ import annotations

# Kernel bandwidth per pixel (28x28 = 784): WIDE is DPImageBench's and FETA-Pro's (rff_sigma 105);
# NARROW draws finer detail but collapses into noise when the class embeddings are noisy, so it
# is chosen only up to a relative noise on a class's mean embedding (relative_noise).
WIDE_BANDWIDTH_PER_PIXEL = 105 / 784
NARROW_BANDWIDTH_PER_PIXEL = 10 / 784
NARROW_MAX_RELATIVE_NOISE = 0.1
# with perceptual features beside them the pixel features keep the narrow kernel at more noise
NARROW_MAX_NOISE_WITH_PERCEPTUAL = 0.15
# the generator fitted to the embedding (synth.tools.kernel.fit): its default size and optimiser
Z_DIM = 60
WIDTH = 16  # channels at the middle resolution (x2 at the first, /2 at the last)
BATCH = 200
LR = 0.01  # Adam, cosine-decayed to lr / 10


def relative_noise(sigma: float, n_features: int, n_records: int, n_classes: int) -> float:
    """The noise norm on a class's mean embedding (whose norm is at most 1), for classes of the
    average size."""
    per_class = max(n_records, 1) / max(n_classes, 1)
    return float(sigma) * n_features**0.5 / per_class


def pixel_noise(
    sigma: float, n_features: int, n_records: int, n_classes: int, perceptual_share: float
) -> float:
    """relative_noise on the pixel features' part of the query, which keeps 1 - perceptual_share
    of each record's squared norm."""
    noise = relative_noise(sigma, n_features, n_records, n_classes)
    return noise / (1.0 - perceptual_share) ** 0.5


def narrow_limit(perceptual_share: float) -> float:
    """The most noise on the pixel features at which the narrow kernel is chosen: higher where
    perceptual features take part of the query."""
    return NARROW_MAX_NOISE_WITH_PERCEPTUAL if perceptual_share > 0 else NARROW_MAX_RELATIVE_NOISE


def auto_bandwidth(n_pixels: int, noise: float, perceptual_share: float = 0.0) -> float:
    """The kernel for a query whose pixel features' class embeddings carry `noise` (pixel_noise),
    beside perceptual features of `perceptual_share`."""
    narrow = noise <= narrow_limit(perceptual_share)
    return (NARROW_BANDWIDTH_PER_PIXEL if narrow else WIDE_BANDWIDTH_PER_PIXEL) * n_pixels
