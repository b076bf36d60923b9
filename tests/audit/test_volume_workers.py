"""The volume audit's per-subject work (registration, comparison, renders: `audit.volumes.
scan_subject`) mapped by the run's executor (issue 56): a progress bar over the subjects, and on
two real Dask worker processes (a LocalCluster started here: slow) every check equals this
process's, number for number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audit import AuditInputs, AuditPolicy, run_audit
from audit.volumes import SUBJECTS_STAGE
from release.executor import ExecutorChoice, InProcess, ItemMapper, mapping_on
from synth.kinds.nifti import load_volume_folder, write_volume
from synth.kinds.volume import VolumeDataset
from tests.support.heads import cohort, each_head_registered_once, needs_templates

pytestmark = needs_templates


@pytest.fixture(scope="module", autouse=True)
def heads_registered_once():
    """The same five heads are registered by the audit run with a mapper and by the one without
    (whose numbers must equal it): 10 registrations, about 0.5 s each. Registration is
    deterministic (tests/synth/test_registration_reproducible.py), so in this module each head is
    registered to each atlas once, by the real code on first use, and the same Registration handed
    back after (as tests/audit/test_audit_volumes.py does)."""
    with each_head_registered_once():
        yield


@pytest.fixture(scope="module")
def cache(head_atlas_cache: Path) -> Path:
    return head_atlas_cache


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> VolumeDataset:
    return load_volume_folder(cohort(tmp_path_factory.mktemp("heads"), 5))


def _inputs(originals: VolumeDataset, tmp_path: Path, cache: Path, map_items) -> AuditInputs:
    """The originals released unchanged (files written, so the headers are read)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, v in enumerate(originals.volumes):
        paths.append(tmp_path / f"r-{i:06d}.nii.gz")
        write_volume(v, paths[-1])
    return AuditInputs(
        release_id="r",
        images=np.zeros((len(originals), 1, 1), np.uint8),
        labels=np.zeros(len(originals), np.int64),
        ids=[f"r-{i:06d}" for i in range(len(originals))],
        expected_count=len(originals),
        label_set=[],
        sensitive=originals,
        heldout=None,
        record_fingerprint_key=b"k" * 32,
        mechanism="deface",
        guarantee_kind="empirical",
        released=originals,
        released_files=paths,
        output_kind="volumes",
        cache_dir=cache,
        map_items=map_items,
    )


def _numbers(report) -> list[tuple]:
    return [(r.name, r.passed, r.summary, repr(r.details)) for r in report.results]


def test_the_subjects_are_mapped_with_a_progress_bar(originals, tmp_path, cache) -> None:
    steps: list[tuple[str, int, int]] = []
    mapper = ItemMapper(InProcess(), lambda s, d, t: steps.append((s, d, t)))
    report = run_audit(_inputs(originals, tmp_path, cache, mapper), AuditPolicy())
    assert [s for s in steps if s[0] == SUBJECTS_STAGE] == [
        (SUBJECTS_STAGE, d, 5) for d in range(6)
    ]
    # without a mapper the audit runs the subjects here, with the same numbers
    alone = run_audit(_inputs(originals, tmp_path / "alone", cache, None), AuditPolicy())
    assert _numbers(alone) == _numbers(report)


@pytest.mark.slow  # two worker processes import torch and SimpleITK, and load the atlas
def test_the_volume_checks_on_two_dask_workers_equal_this_process(originals, tmp_path, cache):
    here = run_audit(
        _inputs(originals, tmp_path / "here", cache, ItemMapper(InProcess())), AuditPolicy()
    )
    with mapping_on(ExecutorChoice(workers=2)) as mapper:
        there = run_audit(_inputs(originals, tmp_path / "there", cache, mapper), AuditPolicy())
        assert mapper.executor.workers == 2
    assert len(here.results) >= 4
    assert _numbers(here) == _numbers(there)
