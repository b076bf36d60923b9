"""Small synthetic head volumes for tests (helpers, not tests): a cohort made by
synth.tools.mri.cohort at a coarse voxel size (seconds), and the public atlases cached once per
test session."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from synth.kinds.head_templates import COLIN_HEAD, colin_available

needs_templates = pytest.mark.skipif(
    not colin_available(),
    reason="Colin27 (Debian package mricron-data) or pydeface is not installed",
)
TEST_MM = 6.0  # voxel size of test volumes: about 30 x 36 x 30 voxels, registration in ~1 s


def cohort(folder: Path, n: int, *, colin_only: bool = False, seed: int = 0) -> Path:
    """`n` synthetic subjects (SYNTHETIC data) at TEST_MM in `folder`."""
    from synth.tools.mri.cohort import BASES, make_cohort

    make_cohort(folder, n, mm=TEST_MM, seed=seed, bases=(COLIN_HEAD,) if colin_only else BASES)
    return folder


def admissible_cohort(
    folder: Path, n: int, cache_dir: Path | None = None, *, seed: int = 0, spare: int = 8
) -> Path:
    """`n` synthetic subjects that pass deface's registration checks: `n + spare` are made and
    those the checks refuse at TEST_MM (a few: quickshear's plane misses a coarse face) removed,
    then any beyond `n`."""
    from synth.kinds.nifti import read_volume
    from synth.mechanisms.deface_reface.admission import _check_one, atlases

    cohort(folder, n + spare, colin_only=True, seed=seed)
    both = atlases(cache_dir)
    kept = 0
    for path in sorted(folder.glob("*.nii*")):
        volume = read_volume(path)
        try:
            _check_one(volume, both, path.name)
        except ValueError:  # a DataFormatError: refused at registration
            path.unlink()
            continue
        kept += 1
        if kept > n:
            path.unlink()
    assert kept >= n, f"only {kept} of {n + spare} synthetic heads pass the checks"
    return folder


@contextmanager
def each_head_registered_once() -> Iterator[None]:
    """Within the block each head is registered to each atlas once, by the real code on first use,
    and the same Registration handed back after. Registration is deterministic
    (tests/synth/test_registration_reproducible.py); about 0.5 s a registration is saved each
    time a module registers the same head again."""
    from synth.tools.mri.atlas import Atlas

    real, memo = Atlas.register, {}

    def register(atlas: Atlas, subject):
        key = (atlas.name, subject.digest())  # dtype, shape, scaling, affine and voxels
        if key not in memo:
            memo[key] = real(atlas, subject)
        return memo[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Atlas, "register", register)
        yield
