"""The shared face tooling on real photographs: detection, landmarks, alignment, the embedder."""

from __future__ import annotations

import numpy as np
import pytest

from accounting.errors import DataFormatError, InvalidParameterError
from synth.tools import face_models as fm
from tests.support import face_photos


@pytest.fixture(scope="module")
def portrait() -> np.ndarray:
    return face_photos.astronaut()


def test_one_face_in_a_portrait_none_in_a_cup_two_side_by_side(portrait) -> None:
    faces = fm.detect(portrait)
    assert len(faces) == 1 and faces[0].landmarks.shape == (68, 2)
    x0, y0, x1, y1 = faces[0].box
    assert 150 < x0 < x1 < 300 and 50 < y0 < y1 < 200  # Eileen Collins' face, upper middle
    assert fm.detect(face_photos.no_face()) == []
    two = fm.detect(face_photos.two_faces())
    assert len(two) == 2 and two[0].area >= two[1].area  # largest first
    assert {f.box[0] < 256 for f in two} == {True, False}  # one face in each half


def test_an_aligned_crop_is_found_again(portrait) -> None:
    """A 64 x 64 aligned crop (a face filling the image) is framed and enlarged for the detector."""
    face = fm.detect(portrait)[0]
    crop = fm.align(portrait, face.landmarks, 64)
    assert crop.shape == (64, 64, 3) and crop.dtype == np.uint8
    again = fm.detect(crop)
    assert len(again) == 1
    eyes = fm.five_points(again[0].landmarks)[:2]
    assert np.allclose(eyes, fm.TEMPLATE_112[:2] * 64 / 112, atol=4)  # eyes where the template is


def test_the_embedder_tells_people_apart(portrait) -> None:
    emb = fm.embedder("dlib")
    a = emb.embed(portrait, fm.detect(portrait)[0])
    flipped = np.ascontiguousarray(portrait[:, ::-1])
    b = emb.embed(flipped, fm.detect(flipped)[0])
    grace = face_photos.grace_hopper()
    c = emb.embed(grace, fm.detect(grace)[0])
    assert a.shape == (128,)
    assert np.linalg.norm(a - b) < emb.threshold < np.linalg.norm(a - c)


def test_landmark_shift_is_in_inter_ocular_distances(portrait) -> None:
    lm = fm.detect(portrait)[0].landmarks
    iod = fm.inter_ocular(lm)
    assert fm.landmark_shift(lm, lm) == 0.0
    assert fm.landmark_shift(lm, lm + [iod * 0.03, iod * 0.04]) == pytest.approx(0.05)


def test_bad_inputs() -> None:
    with pytest.raises(InvalidParameterError, match="Unknown face embedder 'arcface'"):
        fm.embedder("arcface")
    with pytest.raises(DataFormatError, match="uint8"):
        fm.detect(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(DataFormatError, match="3 colour channels"):
        fm.detect(np.zeros((32, 32, 4), np.uint8))
    assert fm.box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
