"""Photographs of any size registered as one dataset: letterboxed, upright, RGB; bad input named."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from accounting.errors import DataFormatError
from accounting.store import Store, Workspace
from release.data import load_registered, register_from_source
from synth.kinds.datasets import load_source
from synth.kinds.photos import parse
from tests.support import face_photos


def test_photos_of_different_sizes_become_one_letterboxed_shape(tmp_path) -> None:
    folder = face_photos.write_folder(tmp_path / "p")
    data = load_source(f"photos-96:{folder}")
    assert data.images.shape == (4, 96, 96, 3) and data.images.dtype == np.uint8
    assert data.class_names == ["photo"] and data.labels.tolist() == [0, 0, 0, 0]
    wide = data.images[3]  # the two-faces photo, 512 x 256: black bars above and below
    assert wide[:20].max() == 0 and wide[-20:].max() == 0 and wide[48].max() > 0
    again = load_source(f"photos-96:{folder}")  # deterministic: the fingerprint is stable
    assert np.array_equal(again.images, data.images)
    assert parse(f"photos:{folder}") == (folder, 512)


def test_exif_orientation_is_applied(tmp_path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :40] = 255  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    Image.fromarray(img).save(folder / "x.jpg", exif=exif, quality=95)
    shown = load_source(f"photos-64:{folder}").images[0]
    assert shown[5:20, 20:44].mean() > 200 and shown[44:60, 20:44].mean() < 50  # white on top


def test_class_subfolders_are_classes_and_labels_are_declared_by_name(tmp_path) -> None:
    root = tmp_path / "p"
    face_photos.write_folder(root / "indoor", with_no_face=False, with_two_faces=False)
    face_photos.write_folder(root / "outdoor", with_two_faces=False)
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    with pytest.raises(DataFormatError, match="declared"):
        register_from_source(store, "f", f"photos-64:{root}", 1.0, 1e-5)
    register_from_source(store, "f", f"photos-64:{root}", 1.0, 1e-5, labels="indoor,outdoor")
    ds, data = load_registered(store, "f")
    assert list(ds.labels) == [0, 1] and data.labels.tolist() == [0, 0, 1, 1, 1]
    flat = face_photos.write_folder(tmp_path / "flat")
    register_from_source(store, "g", f"photos-64:{flat}", 1.0, 1e-5)  # one class: no declaration
    assert list(load_registered(store, "g")[0].labels) == [0]


@pytest.mark.parametrize(
    ("setup", "source", "message"),
    [
        ("corrupt", "photos-64:{d}", "not a readable image"),
        ("mixed", "photos-64:{d}", "both photos"),
        ("empty", "photos-64:{d}", "no photos found"),
        ("ok", "photos-32:{d}", "between 64 and 2048"),
        ("ok", "photos:{d}/missing", "no such folder"),
    ],
)
def test_bad_folders_are_refused_with_the_file_and_the_fix(tmp_path, setup, source, message):
    d = tmp_path / "p"
    d.mkdir()
    if setup in ("corrupt", "ok", "mixed"):
        face_photos.write_folder(d, with_no_face=False, with_two_faces=False)
    if setup == "corrupt":
        (d / "z_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    if setup == "mixed":
        (d / "sub").mkdir()
    with pytest.raises(DataFormatError, match=message) as err:
        load_source(source.format(d=d))
    if setup == "corrupt":
        assert "z_broken.jpg" in str(err.value) and "Remove or replace" in str(err.value)
