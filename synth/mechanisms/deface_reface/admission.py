"""What a head-volume dataset must satisfy before anything can be charged on it: checked when it is
registered (the image-dependent checks: orientation, the registrations' fit, masks big enough for
every method, memory) and when a release is planned (the method's minimum grid and memory, from the
registered shape). A run that would fail, or hang, after reading the data leaves a charge behind, so
everything that can be known beforehand is refused beforehand, with the number and the limit.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from accounting.errors import DataFormatError, InvalidParameterError
from synth.kinds.volume import Volume, VolumeDataset
from synth.progress import ProgressFn, no_progress
from synth.tools.mri.atlas import atlases
from synth.tools.mri.registration import check_fit

# Smallest grid (voxels per side) each method works on: registration's 8 mm level needs a few
# voxels across the head, and quickshear fits its plane to the lower hull of the brain's sagittal
# outline, which degenerates (an empty hull) when the brain spans a handful of voxels.
MIN_GRID = {"deface:quickshear": 16, "deface:mask": 12, "reface": 12}
MIN_MASK_VOXELS = 50  # the registered brain and face must each cover at least this many voxels
# Peak memory of one subject, in bytes per voxel beyond the stored arrays. Measured on a 1 mm int16
# head (181 x 217 x 181): deface 15 (mask) and 19 (quickshear), reface 47, the audit 52, plus the
# registration child's own arrays; rounded up.
PEAK_BYTES_PER_VOXEL = {"deface:quickshear": 32, "deface:mask": 32, "reface": 56, "audit": 64}


def method_key(mechanism: str, method: str | None = None) -> str:
    return f"deface:{method}" if mechanism == "deface" else mechanism


def machine_memory() -> int:
    """The memory this process may use, in bytes: physical memory, or a smaller cgroup limit."""
    total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


# Heads the coordinator holds at once, whatever the number in the dataset: the one a run edits here
# (its original and released copy; with workers, one coming back), and one pair being saved or
# audited (original and released). Released heads wait in the run's work folder, not in memory.
HEADS_HELD = 4
WIDEST_VOXEL = 8  # bytes: the stored type is not public at plan time, so assume float64


def peak_memory(key: str, largest_voxels: int, itemsize: int = WIDEST_VOXEL) -> int:
    """Estimated peak bytes of a run (or its audit) on the coordinator: HEADS_HELD heads of the
    largest volume's size in its stored type, plus one subject's working arrays. It does not grow
    with the number of heads: results are read back one at a time from the run's work folder."""
    per_voxel = max(PEAK_BYTES_PER_VOXEL[key], PEAK_BYTES_PER_VOXEL["audit"])
    return (HEADS_HELD * itemsize + per_voxel) * largest_voxels


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _short_of_memory(key: str, largest_voxels: int, itemsize: int, what: str) -> str | None:
    """None when a run (peak_memory) fits this machine's memory; else the words saying by how much,
    `what` describing the volumes."""
    need, have = peak_memory(key, largest_voxels, itemsize), machine_memory()
    if need <= have:
        return None
    return f"needs about {_gib(need)} of memory ({what}), more than this machine's {_gib(have)}"


def check_plan(mechanism: str, method: str | None, shape: tuple[int, ...], count: int) -> None:
    """Plan-time admission from the registered (common) shape: the method's minimum grid and the
    run's memory against this machine's. Shapes that vary were checked volume by volume when the
    dataset was registered (`check_heads`)."""
    if len(shape) != 3:
        return
    key = method_key(mechanism, method)
    if min(shape) < MIN_GRID[key]:
        raise InvalidParameterError(
            f"[{mechanism}] the volumes are {shape[0]}x{shape[1]}x{shape[2]} voxels; "
            f"{key.replace(':', ' method ')} needs at least {MIN_GRID[key]} voxels per side. "
            "Register scans at a finer voxel size."
        )
    voxels = int(np.prod(shape))
    # the number of volumes does not count: the coordinator holds a few heads at a time
    grid = f"{count} volumes of {shape[0]}x{shape[1]}x{shape[2]} voxels, {HEADS_HELD} held at once"
    short = _short_of_memory(key, voxels, WIDEST_VOXEL, grid)
    if short:
        raise InvalidParameterError(
            f"[{mechanism}] the run {short}. "
            "Run it on a bigger machine or register the scans at a coarser voxel size."
        )


def _check_one(volume: Volume, atlases_: tuple, what: str) -> None:
    from synth.mechanisms.deface_reface.edit import quickshear_keep

    for atlas in atlases_:
        reg = atlas.register(volume)
        check_fit(reg, f"{what} (registering {atlas.name})")
        masks = atlas.on(volume, reg)
        for part in ("brain", "face"):
            found = int(getattr(masks, part).sum())
            if found < MIN_MASK_VOXELS:
                raise DataFormatError(
                    f"{what}: the registered {part} covers {found} voxels of the "
                    f"{'x'.join(map(str, volume.shape))} grid (at least {MIN_MASK_VOXELS} "
                    "needed): the grid is too coarse or does not hold the whole head. Register "
                    "scans with the face and brain in a finer grid."
                )
        try:
            cut = ~quickshear_keep(masks.brain, volume.affine, 10)
        except (ValueError, IndexError) as exc:
            raise DataFormatError(
                f"{what}: quickshear cannot fit its plane under this brain ({exc}); the grid "
                f"{'x'.join(map(str, volume.shape))} is too coarse. Register finer scans."
            ) from exc
        if not cut.any():
            raise DataFormatError(
                f"{what}: quickshear's plane cuts nothing from this head; the grid "
                f"{'x'.join(map(str, volume.shape))} is too coarse or the face is outside it."
            )


def check_heads(
    data: VolumeDataset, cache_dir: Path | None = None, progress: ProgressFn = no_progress
) -> None:
    """Registration-time admission of every volume: the templates fit it in its header's
    orientation (both the mechanisms' and the audit's), its brain and face are found, quickshear
    can cut it, and a run's few heads at a time (its largest) fit in this machine's memory."""
    # from the headers (a folder held by reference is not read): the largest head's voxels and
    # the widest stored type, HEADS_HELD of them at once whatever the number of heads
    largest = max(int(np.prod(shape)) for shape in data.shapes)
    itemsize = max(
        r.data.itemsize if isinstance(r, Volume) else r.nbytes // int(np.prod(r.shape))
        for r in data.records
    )
    worst = max(PEAK_BYTES_PER_VOXEL, key=lambda k: PEAK_BYTES_PER_VOXEL[k])
    short = _short_of_memory(
        worst, largest, itemsize, f"the largest holds {largest:,} voxels, {HEADS_HELD} at once"
    )
    if short:
        raise DataFormatError(
            f"{data.source}: a release of these volumes {short}. Register "
            "fewer volumes or scans at a coarser voxel size, or use a bigger machine."
        )
    both = atlases(cache_dir)
    for i, volume in enumerate(data.volumes):
        progress("checking heads", i, len(data))
        _check_one(volume, both, f"{data.source}/{volume.name}" if data.source else volume.name)
    progress("checking heads", len(data), len(data))
