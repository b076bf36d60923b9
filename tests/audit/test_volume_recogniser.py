"""The face recogniser arm of the volume audit's re-identification test, on real renders: the
before/after grid of docs/volumes-renders.png (four synthetic 1 mm heads; columns original,
quickshear, mask, reface), rendered by the same `picture` the audit uses. Every recogniser of
synth.tools.face_recognisers attacks them (issue 54)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from audit.policy import AuditPolicy
from audit.volumes import RECOGNISERS, _judge_reid, recognise
from synth.tools import face_recognisers as fr

GRID = Path(__file__).resolve().parents[2] / "docs" / "volumes-renders.png"


def _column(c: int) -> list[np.ndarray]:
    im = np.asarray(Image.open(GRID).convert("L"))
    h, w = im.shape[0] // 4, im.shape[1] // 4
    return [im[r * h : (r + 1) * h, c * w : (c + 1) * w] for r in range(4)]


@pytest.mark.parametrize("key", RECOGNISERS)
def test_an_unchanged_head_is_named_by_each_recogniser(key) -> None:
    originals = _column(0)
    rec = recognise(originals, originals, fr.recogniser(key))
    assert rec is not None
    assert rec.originals_with_face == 4 and rec.released_with_face == 4
    assert rec.hits == 4 and rec.matches == [0, 1, 2, 3]
    assert rec.chance == 0.25 and rec.p_value < 0.01  # 0.25 ** 4


def test_a_render_without_a_face_names_nobody() -> None:
    originals = _column(0)
    blank = [np.zeros_like(p) for p in originals]
    rec = recognise(originals, blank, fr.recogniser("dlib"))
    assert rec is not None
    assert rec.released_with_face == 0 and rec.hits == 0 and rec.matches == [None] * 4
    assert rec.p_value == 1.0


def test_released_faces_are_judged_against_every_original_not_only_their_own() -> None:
    """Each original's face shown as another subject's release: a hit would need it to be named
    as its own subject, so a derangement of the same faces scores no hits."""
    originals = _column(0)
    shuffled = originals[1:] + originals[:1]
    rec = recognise(originals, shuffled, fr.recogniser("dlib"))
    assert rec is not None and rec.released_with_face == 4
    assert rec.hits == 0 and rec.matches == [1, 2, 3, 0] and rec.p_value == 1.0


def test_too_few_faces_among_the_originals_is_not_a_verdict() -> None:
    blank = [np.zeros((100, 100), np.uint8)] * 4
    assert recognise(blank, blank, fr.recogniser("dlib")) is None


def test_a_recogniser_that_finds_no_face_in_the_originals_fails_the_release() -> None:
    """Issue 57: "no face found in the original renders" passed as "not run". An attack that
    cannot see the faces it should protect proves nothing: the check fails."""
    rng = np.random.default_rng(0)
    depth = [rng.normal(size=(12, 12)) for _ in range(5)]
    flat = [np.zeros((12, 12)) for _ in range(5)]
    faces = [np.ones((12, 12), bool)] * 5
    blank = [np.zeros((100, 100), np.uint8)] * 5
    check = _judge_reid(depth, flat, faces, AuditPolicy(), blank, blank)
    assert check.passed is False
    assert check.details["recognisers_blind"] == list(RECOGNISERS)
    assert "FOUND NO FACE" in check.summary
