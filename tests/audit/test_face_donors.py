"""The donor re-identification attack of k-Same-M face releases (audit/face_donors.py): judging its
numbers against 1/k and the published thresholds, and computing them on real photographs."""

from __future__ import annotations

import numpy as np
import pytest

from audit.face_donors import DonorNumbers, compute_donor_reid, judge_donor_reid
from synth.kinds.datasets import ImageDataset
from synth.tools import face_recognisers as fr
from tests.support import face_photos


def _numbers(hits: int, trials: int, verified: int = 0) -> DonorNumbers:
    return DonorNumbers("sface", 5, 8, hits, verified, (0, 0), hits, trials)


def test_a_donor_picked_at_about_1_in_k_passes() -> None:
    check = judge_donor_reid(_numbers(2, 7), 0.05)
    assert check.passed is True and check.name == "face_donor_reid[sface]"
    assert "bound 1/k = 0.200" in check.summary


def test_a_donor_picked_far_above_1_in_k_fails() -> None:
    check = judge_donor_reid(_numbers(5, 7), 0.05)  # p = 0.005 against 1/5
    assert check.passed is False and check.details["worst_donor_p_value"] < 0.05


def test_a_verified_donor_fails_even_at_chance_rank1() -> None:
    check = judge_donor_reid(_numbers(1, 7, verified=1), 0.05)
    assert check.passed is False and "1 with a donor verified" in check.summary


def test_no_face_seen_is_not_a_pass() -> None:
    check = judge_donor_reid(DonorNumbers("sface", 5, 0, 0, 0, None, 0, 0), 0.05)
    assert check.passed is None and check.summary.startswith("not run")


@pytest.fixture(scope="module")
def photos() -> ImageDataset:
    images = [face_photos.astronaut()[:, :, :], face_photos.grace_hopper()[:512, :512]]
    images = [
        np.ascontiguousarray(np.pad(i, ((0, 512 - i.shape[0]), (0, 512 - i.shape[1]), (0, 0))))
        for i in images
    ]
    two = np.zeros((512, 512, 3), np.uint8)
    two[128:384] = face_photos.two_faces()
    return ImageDataset(np.stack(images + [two]), np.zeros(3, np.int64), ["photo"], "test photos")


def test_a_donor_who_is_the_same_person_in_another_photo_is_verified(photos) -> None:
    """Released unchanged, with one cluster of the 4 faces: Eileen Collins is in photos 0 and 2,
    so each of her faces has her other face as a donor, within SFace's threshold."""
    clusters = [[[0, 0], [1, 0], [2, 0], [2, 1]]]
    sources = [np.array([i]) for i in range(3)]
    numbers = compute_donor_reid(
        photos.images, sources, photos, clusters, fr.recogniser("sface"), 2
    )
    assert numbers.n_faces == 4
    assert numbers.donors_verified >= 2  # Collins' two faces, and Hopper's two
    assert judge_donor_reid(numbers, 0.05).passed is False
