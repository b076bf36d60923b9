"""Small synthetic head volumes for tests (helpers, not tests): a cohort made by synth.tools.mri.cohort at
a coarse voxel size (seconds), and the public atlases cached once per test session."""

from __future__ import annotations

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
