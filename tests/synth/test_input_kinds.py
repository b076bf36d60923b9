"""Input data kinds (synth/kinds/inputs): each source is recognised as the kind it holds, loaded
data and registered datasets are told apart the same way, each kind fingerprints as the keyed
fingerprints of accounting/fingerprint.py do, and a registered source that now holds another kind
is refused on loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from accounting.errors import DataFormatError, DatasetConflictError
from accounting.fingerprint import dataset_fingerprint, volumes_fingerprint
from accounting.store import Store, Workspace
from release.data import data_kind, load_registered, register_from_source
from synth.kinds import inputs
from synth.kinds.datasets import uci_digits
from synth.kinds.head_templates import SOURCE as TEMPLATES
from synth.kinds.nifti import write_volume
from synth.kinds.volume import Volume

KEY = b"k" * 32


def _heads(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(2):
        data = rng.integers(0, 500, (16, 18, 16), dtype=np.int16)
        write_volume(Volume(data, np.eye(4)), folder / f"h{i}.nii")
    return folder


def _npz(path: Path) -> Path:
    data = uci_digits()
    np.savez(path, images=data.images[:40], labels=data.labels[:40])
    return path


def test_each_source_is_recognised_as_the_kind_it_holds(tmp_path) -> None:
    heads, npz = _heads(tmp_path / "heads"), _npz(tmp_path / "d.npz")
    assert inputs.for_source(str(heads)).name == "volumes"
    assert inputs.for_source(TEMPLATES).name == "volumes"
    assert inputs.for_source(str(npz)).name == "images"
    assert inputs.for_source("builtin:uci-digits").name == "images"
    volumes = inputs.for_source(str(heads)).load(str(heads))
    images = inputs.for_source(str(npz)).load(str(npz))
    assert inputs.of_data(volumes).name == "volumes" and inputs.of_data(images).name == "images"
    assert inputs.registered_as(False).name == "volumes"
    assert inputs.registered_as(True).name == "images"
    with pytest.raises(DataFormatError, match="no class labels"):
        inputs.for_source(str(heads)).declare(str(heads), volumes, "0-1")


def test_each_kind_fingerprints_as_accounting_does(tmp_path) -> None:
    heads, npz = _heads(tmp_path / "heads"), _npz(tmp_path / "d.npz")
    volumes = inputs.for_source(str(heads)).load(str(heads))
    images = inputs.for_source(str(npz)).load(str(npz))
    assert inputs.of_data(volumes).fingerprint(KEY, volumes) == volumes_fingerprint(
        KEY, [v.stored_bytes() for v in volumes.volumes]
    )
    assert inputs.of_data(images).fingerprint(KEY, images) == dataset_fingerprint(
        KEY, images.images, images.labels
    )


def test_a_registered_source_that_now_holds_another_kind_is_refused(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    folder = tmp_path / "data"
    folder.mkdir()
    for c in ("a", "b"):  # a class folder of images
        (folder / c).mkdir()
        for i, im in enumerate(uci_digits().images[:3]):
            Image.fromarray(im).save(folder / c / f"{i}.png")
    ds, _ = register_from_source(store, "d", str(folder), 10.0, 1e-5, labels="a,b")
    assert data_kind(ds) == "images" and ds.privacy_unit == "one image"
    assert load_registered(store, "d")[1].label_set == [0, 1]
    write_volume(Volume(np.arange(16 * 18 * 16).reshape(16, 18, 16), np.eye(4)), folder / "x.nii")
    with pytest.raises(
        DatasetConflictError, match="registered as images, which is no longer there"
    ):
        load_registered(store, "d")
