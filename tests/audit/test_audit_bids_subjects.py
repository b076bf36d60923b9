"""The volume audit counts subjects, not files, fast: a BIDS subject's sessions and contrasts are
one person, so the re-identification takes one record per subject as its probes and gallery and
its minimum counts subjects (4 subjects x 2 sessions cannot run it: the policy refuses)."""

from __future__ import annotations

import numpy as np

from audit.policy import AuditPolicy
from audit.volumes import _reid_results, _SubjectScan, reid_subjects
from synth.kinds.bids_layout import BidsLayout, BidsRecord
from synth.kinds.volume import Volume, VolumeDataset


def _dataset(subjects: int, sessions: int) -> VolumeDataset:
    records, volumes = [], []
    for s in range(1, subjects + 1):
        for ses in range(1, sessions + 1):
            for suffix in ("T2w", "T1w"):  # T2w first: the T1w still stands for the subject
                path = f"sub-{s:02d}/ses-{ses}/anat/sub-{s:02d}_ses-{ses}_{suffix}.nii.gz"
                records.append(BidsRecord(path, f"{s:02d}", str(ses), suffix))
                volumes.append(Volume(np.ones((2, 2, 2), np.int16), np.eye(4)))
    return VolumeDataset(volumes, "t", layout=BidsLayout(tuple(records)))


def test_one_record_per_subject_its_first_t1w() -> None:
    data = _dataset(5, 2)
    heads = data.subject_heads()
    assert heads == [1, 5, 9, 13, 17]
    assert {data.layout.records[i].suffix for i in heads} == {"T1w"}
    assert reid_subjects(heads, AuditPolicy()) == set(heads)
    flat = VolumeDataset([Volume(np.ones((2, 2, 2), np.int16), np.eye(4))] * 6, "flat")
    assert flat.subject_heads() == list(range(6)) and reid_subjects(6, AuditPolicy()) == set(
        range(6)
    )


def test_the_sample_is_drawn_among_subjects() -> None:
    data = _dataset(12, 2)
    policy = AuditPolicy.from_dict({"volume_reid_samples": 5})
    drawn = reid_subjects(data.subject_heads(), policy)
    assert len(drawn) == 5 and drawn <= set(data.subject_heads())
    assert len({data.subjects[i] for i in drawn}) == 5


def test_four_subjects_in_two_sessions_cannot_run_the_attack() -> None:
    data = _dataset(4, 2)
    scan = _SubjectScan(
        drawn=reid_subjects(data.subject_heads(), AuditPolicy())
        and sorted(reid_subjects(data.subject_heads(), AuditPolicy()))
    )
    assert len(data) == 16 and len(scan.drawn) == 4
    (check,) = _reid_results(scan, len(data.subject_heads()), AuditPolicy())
    assert check.passed is False
    assert "4 subjects; the re-identification test needs at least 5" in check.summary
