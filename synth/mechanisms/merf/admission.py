"""Whether a merf release can finish, judged at plan time from its config and the registered
shapes (public quantities only): a kernel bandwidth that keeps the random features finite and
meaningful, and the memory the run will need against this machine's. The plan refuses what fails,
so nothing is charged for a run that would die (or release black images) after reading the data;
the run asks again before it reads anything, where a refusal is refunded."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from accounting.errors import InvalidParameterError

# The bandwidth per pixel of the generator's images. The auto choices are 10/784 and 105/784
# (config.py). Below the minimum, W = N(0, 1 / bandwidth) makes x.W of std sqrt(pixels / bandwidth)
# above 100 radians: cos/sin of it are noise in float32, and far below (1e-300) W is infinite and
# the query NaN. Above the maximum, x.W stays under 0.01 radians: every image has the same features.
BANDWIDTH_PER_PIXEL_MIN = 1e-4
BANDWIDTH_PER_PIXEL_MAX = 1e4
MEMORY_SHARE = 0.8  # of the machine's memory a run may plan to use (the OS and the audit need room)
RUNTIME_BYTES = 1 << 30  # the interpreter, torch and numpy themselves
EMBED_CHUNK = 2048  # images per chunk of the query (embedding.class_sums)
DRAW_BATCH = 1000  # images per batch when drawing (generator.draw)
CHECK_PER_CLASS = 500  # images per class of the collapse check (fit.class_distances)
# EfficientNet-Lite0 at 32 px, bytes per image: forward alone, and with backward (upper bounds of
# what it takes; BENCHMARKS-NOTEBOOK.md, "Measurement history from the code")
PERCEPTUAL_FORWARD = 1 << 19
PERCEPTUAL_TRAINING = 1 << 21
F32, F64 = 4, 8


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes at the run's peak: what stays resident and the largest stage on top of it."""

    resident: dict[str, int]
    stages: dict[str, int]

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=lambda k: self.stages[k])

    @property
    def total(self) -> int:
        return RUNTIME_BYTES + sum(self.resident.values()) + self.stages[self.peak_stage]

    @property
    def largest(self) -> tuple[str, int]:
        """The one part that weighs most (what to lower first)."""
        parts = {**self.resident, **self.stages}
        name = max(parts, key=lambda k: parts[k])
        return name, parts[name]


# what lowers each part, in a spec's words
ADVICE = {
    "the registered images": "register the images smaller (e.g. `--source photos-128:DIR`)",
    "random-feature frequencies": "lower `n_features`",
    "generator and its optimiser": "lower `z_dim` or `width`",
    "query": "lower `n_features` or `perceptual_share`",
    "generator training": "lower `batch` (or `n_features`, `width`)",
    "collapse check": "lower `n_features` or register smaller images",
    "drawing the released images": "lower `n_images` (the spec's [release] table) or `n_samples`",
    "DP label classifier": "lower `teacher_batch` or set `teacher_labels = false`",
}


def machine_memory() -> int:
    """This machine's memory in bytes: physical memory, or a smaller cgroup (container) limit."""
    total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def _generator_activations(size: int, channels: int, width: int) -> int:
    """Floats one image keeps for the backward pass through generator.ConditionalGenerator (a
    forward pass without gradients holds about two of its layers: _forward_peak)."""
    b2 = (size // 4) ** 2
    return (
        3 * 2 * width * b2  # fc, batch norm, ReLU
        + 2 * width * 4 * b2  # upsample
        + 3 * width * 4 * b2  # conv, batch norm, ReLU
        + width * 16 * b2  # upsample
        + 3 * (width // 2) * 16 * b2  # conv, batch norm, ReLU
        + 2 * channels * 16 * b2  # conv, sigmoid
    )


def memory_estimate(
    *,
    image_shape: tuple[int, ...],
    n_records: int,
    n_classes: int,
    size: int,
    n_features: int,
    z_dim: int,
    width: int,
    batch: int,
    n_samples: int,
    perceptual_share: float,
    teacher_batch: int | None,
) -> MemoryEstimate:
    """The run's memory, part by part (Python integers: no overflow whatever the config says)."""
    channels = 1 if len(image_shape) == 2 else int(image_shape[-1])
    image_bytes = 1
    for d in image_shape:
        image_bytes *= int(d)
    pixels = channels * size * size  # the generator's image, flattened
    half = n_features // 2
    # per image: its features (x.W, cos, sin, the concatenation) and the image as floats
    per_feature_row = 4 * half * F32 + 2 * pixels * F32
    perceptual = perceptual_share > 0
    fc = (2 * z_dim + 1) * 2 * width * (size // 4) ** 2
    convs = 9 * (2 * width * width + width * (width // 2) + (width // 2) * channels)
    params = n_classes * z_dim + fc + convs
    activations = _generator_activations(size, channels, width) * F32
    forward = 2 * max(width, channels) * size * size * F32  # the largest layer and its input
    chunk = min(EMBED_CHUNK, max(n_records, 1))
    checked = n_classes * CHECK_PER_CLASS
    draw_batch = min(DRAW_BATCH, max(n_samples, 1))
    resident = {
        "the registered images": n_records * image_bytes,
        "random-feature frequencies": half * pixels * F32,
        "generator and its optimiser": 4 * params * F32,  # weights, gradients, Adam's two moments
    }
    stages = {
        "query": chunk * (per_feature_row + n_features * F64 * 2 + perceptual * PERCEPTUAL_FORWARD),
        # forward kept for backward, and the gradients of as much
        "generator training": 2 * batch * (activations + per_feature_row)
        + batch * perceptual * PERCEPTUAL_TRAINING,
        "collapse check": checked * (pixels + per_feature_row) + draw_batch * forward,
        # the drawn batches and their concatenation
        "drawing the released images": 2 * n_samples * image_bytes + draw_batch * forward,
    }
    if tuple(int(d) for d in image_shape[:2]) != (size, size):  # drawn, then resized as floats
        stages["drawing the released images"] += 2 * n_samples * pixels * F32
    if teacher_batch is not None:
        # the batch as floats, two strided convolutions (16 and 32 channels) forward and backward
        conv = (16 * (size // 2) ** 2 + 32 * (size // 4) ** 2) * F32
        stages["DP label classifier"] = 2 * teacher_batch * (3 * pixels * F32 + 3 * conv)
    return MemoryEstimate(resident, stages)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB"


def check_bandwidth(bandwidth: float, n_pixels: int) -> None:
    """Refuse a kernel whose random features would be infinite, noise or constant."""
    per_pixel = float(bandwidth) / n_pixels
    if not BANDWIDTH_PER_PIXEL_MIN <= per_pixel <= BANDWIDTH_PER_PIXEL_MAX:
        low, high = BANDWIDTH_PER_PIXEL_MIN * n_pixels, BANDWIDTH_PER_PIXEL_MAX * n_pixels
        raise InvalidParameterError(
            f"[merf] bandwidth = {bandwidth:g} is {per_pixel:.3g} per pixel of the generator's "
            f"{n_pixels}-pixel images; it must be from {low:.4g} to {high:.4g} "
            f"({BANDWIDTH_PER_PIXEL_MIN:g} to {BANDWIDTH_PER_PIXEL_MAX:g} per pixel), or the "
            "random features are infinite or meaningless and the release is noise. Leave "
            "`bandwidth` out (auto) or set one in that range. Nothing was charged."
        )


def check_memory(estimate: MemoryEstimate, limit: int | None = None) -> None:
    """Refuse a run whose estimated peak exceeds MEMORY_SHARE of this machine's memory (or
    `limit` bytes)."""
    machine = machine_memory()
    limit = int(MEMORY_SHARE * machine) if limit is None else int(limit)
    if estimate.total <= limit:
        return
    part, weight = estimate.largest
    raise InvalidParameterError(
        f"[merf] this release would need about {_gb(estimate.total)} of memory at its peak "
        f"({part}: {_gb(weight)}), more than the {_gb(limit)} a run may use here "
        f"({MEMORY_SHARE:.0%} of this machine's {_gb(machine)}). {ADVICE[part].capitalize()}, "
        "then plan again. Nothing was charged."
    )
