"""A folder of NIfTI head volumes on the way in: every bad input gets its own clear error, nothing
is registered from it; what is written back keeps the stored voxels and drops identifying header
fields."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from accounting import ledger
from accounting.errors import DataFormatError, DatasetConflictError
from accounting.store import Store, Workspace
from release.data import data_kind, load_registered, register_from_source
from synth.kinds.datasets import is_volume_source, load_data
from synth.kinds.head_templates import colin_available
from synth.kinds.nifti import header_text, load_volume_folder, read_volume, write_volume
from synth.kinds.volume import Volume, VolumeDataset
from tests.support.heads import cohort, needs_templates


def _head(seed: int = 0, shape=(20, 24, 20), dtype=np.int16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros(shape, dtype)
    x[3:-3, 3:-3, 3:-3] = rng.integers(50, 900, (shape[0] - 6, shape[1] - 6, shape[2] - 6))
    return x


def _save(path: Path, data: np.ndarray, zooms=(2.0, 2.0, 2.0), **header) -> Path:
    img = nib.Nifti1Image(data, np.diag([*zooms, 1.0]))
    for k, v in header.items():
        img.header[k] = v
    nib.save(img, str(path))
    return path


def _patched_pixdim(path: Path, value: float) -> None:
    """A file whose header says voxel size `value` along y (nibabel would not write it)."""
    raw = bytearray(nib.Nifti1Image(_head(0), np.diag([2.0, 2.0, 2.0, 1.0])).to_bytes())
    raw[84:88] = np.float32(value).tobytes()  # pixdim[2]
    path.write_bytes(gzip.compress(bytes(raw)))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "heads"
    d.mkdir()
    for i in range(3):
        _save(d / f"sub-{i:02d}.nii.gz", _head(i), descrip=b"Jane Doe 1970-01-01")
    (d / "sub-00.json").write_text('{"PatientName": "x"}')  # BIDS sidecar: not read
    return d


@pytest.fixture
def store(tmp_path: Path, head_atlas_cache: Path, monkeypatch) -> Store:
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(head_atlas_cache))  # registration's head checks
    ws = Workspace(tmp_path / "ws")
    ws.init()
    return Store(ws)


def test_a_folder_of_nifti_files_is_a_volume_dataset(folder: Path) -> None:
    assert is_volume_source(str(folder))
    data = load_data(str(folder))
    assert isinstance(data, VolumeDataset) and len(data) == 3
    assert data.image_shape == (20, 24, 20) and data[0].zooms == (2.0, 2.0, 2.0)
    assert data[0].data.dtype == np.int16  # stored type kept, never rescaled


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: _save(p, np.stack([_head(0)] * 2, -1)), "4D series of 2 volumes"),
        (
            lambda p: _save(p, np.arange(4 * 24 * 20, dtype=np.int16).reshape(4, 24, 20)),
            "each side",
        ),
        (lambda p: _patched_pixdim(p, 0.01), "voxel sizes"),
        (lambda p: _save(p, _head(0), zooms=(2.0, 50.0, 2.0)), "voxel sizes"),
        (lambda p: _save(p, np.full((20, 24, 20), np.nan, np.float32)), "NaN or infinite"),
        (lambda p: _save(p, np.full((20, 24, 20), 7, np.int16)), "holds no image"),
        (lambda p: _save(p, _head(0).astype(np.complex64)), "complex, RGB or other"),
        (lambda p: p.write_bytes(b"not a nifti file at all" * 20), "not a readable NIfTI"),
    ],
    ids=["4d", "tiny", "zero-voxel", "huge-voxel", "nan", "blank", "complex", "garbage"],
)
def test_each_bad_volume_is_refused_with_its_own_message(tmp_path, make, message) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    _save(d / "a.nii.gz", _head(1))
    make(d / "b.nii.gz")
    with pytest.raises(DataFormatError, match=message):
        load_volume_folder(d)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "cut"
    d.mkdir()
    path = _save(d / "a.nii.gz", _head(0))
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    with pytest.raises(DataFormatError, match="truncated or damaged|not a readable"):
        load_volume_folder(d)


def test_an_empty_folder_and_a_link_outside_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataFormatError, match="no NIfTI files"):
        load_volume_folder(empty)
    outside = _save(tmp_path / "elsewhere.nii.gz", _head(0))
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(outside, linked / "a.nii.gz")
    with pytest.raises(DataFormatError, match="outside the folder"):
        load_volume_folder(linked)


def test_a_written_volume_keeps_its_stored_voxels_and_scaling_but_not_its_text(tmp_path) -> None:
    src = tmp_path / "src.nii.gz"
    img = nib.Nifti1Image(_head(3), np.diag([1.2, 1.0, 0.9, 1.0]))
    img.header.set_slope_inter(0.5, 10.0)
    img.header["descrip"] = b"John Smith, MRN 12345"
    img.header["aux_file"] = b"john.txt"
    img.header.extensions.append(nib.nifti1.Nifti1Extension(6, b"patient: John Smith"))
    nib.save(img, str(src))
    assert set(header_text(src)) == {"descrip", "aux_file", "extensions"}
    vol = read_volume(src)
    assert (vol.slope, vol.inter) == (0.5, 10.0)
    out = tmp_path / "out.nii.gz"
    write_volume(vol, out)
    back = read_volume(out)
    assert header_text(out) == {}
    assert np.array_equal(back.data, vol.data) and back.data.dtype == vol.data.dtype
    assert (back.slope, back.inter) == (0.5, 10.0)
    assert np.allclose(back.affine, vol.affine)
    first = out.read_bytes()
    write_volume(vol, out)
    assert out.read_bytes() == first  # deterministic bytes: bundles are reproducible


def test_physical_values_go_back_to_the_stored_type_clipped() -> None:
    vol = Volume(np.zeros((8, 8, 8), np.int16), np.eye(4), slope=2.0, inter=-100.0)
    assert vol.to_stored(np.array([-100.0, 0.0, 1e308])).tolist() == [0, 50, 32767]


@needs_templates
def test_registration_fingerprints_volumes_and_catches_a_changed_file(tmp_path, store) -> None:
    blocks = tmp_path / "blocks"  # the `folder` fixture's volumes: not heads
    blocks.mkdir()
    _save(blocks / "sub-00.nii.gz", _head(0))
    # registration checks they are heads: real ones (two: each costs a registration)
    folder = cohort(tmp_path / "heads", 2)
    shape = list(read_volume(folder / "subject-00.nii.gz").shape)
    ds, created = register_from_source(store, "heads", str(folder), 10.0, 1e-5, actor="steward")
    assert created and ds.record_count == 2 and ds.labels == [] and data_kind(ds) == "volumes"
    assert ds.privacy_unit == "one head scan" and ds.image_shape in ([], shape)
    again, created = register_from_source(store, "heads", str(folder), 10.0, 1e-5)
    assert not created and again.fingerprint == ds.fingerprint
    # a name already taken is refused for what it is, before the head checks (which the same
    # content passed when it was registered, and which other content would run for nothing)
    with pytest.raises(DatasetConflictError, match="already registered with different content"):
        register_from_source(store, "heads", str(blocks), 10.0, 1e-5)
    _, data = load_registered(store, "heads")
    assert isinstance(data, VolumeDataset)
    first = data[0]
    edited = first.data.copy()
    edited[10, 10, 10] += 1  # one voxel, behind the CLI's back
    write_volume(first.with_data(edited), folder / "subject-00.nii.gz")
    with pytest.raises(DatasetConflictError, match="have changed"):
        load_registered(store, "heads")
    for f in folder.glob("*.nii.gz"):
        f.unlink()
    with pytest.raises(DatasetConflictError, match="no longer there"):
        load_registered(store, "heads")


def test_blocks_that_are_not_heads_are_refused_at_registration(folder, store) -> None:
    """Registration fits the head templates to every volume before anything can be charged on
    it: random blocks fit nowhere (issue 57: a failed fit was recorded, never judged)."""
    if not colin_available():
        pytest.skip("Colin27 (mricron-data) or pydeface is not installed")
    with pytest.raises(
        DataFormatError, match="does not fit this image|fits the template best|covers .* voxels"
    ):
        register_from_source(store, "heads", str(folder), 10.0, 1e-5)
    assert ledger.list_datasets(store) == []


def _scaled(path: Path, data: np.ndarray, slope: float) -> Path:
    img = nib.Nifti1Image(data, np.diag([2.0, 2.0, 2.0, 1.0]))
    img.header.set_slope_inter(slope, 0.0)
    nib.save(img, str(path))
    return path


def _sform_scaled(path: Path) -> Path:
    """pixdim 2 mm (and the qform), but an sform scaled x1000: tools place voxels by the sform."""
    img = nib.Nifti1Image(_head(0), np.diag([2.0, 2.0, 2.0, 1.0]))
    img.set_sform(np.diag([2000.0, 2000.0, 2000.0, 1.0]), code=2)
    nib.save(img, str(path))
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        # issue 57 item 2: finite in float64, infinite in the float32 registration computes in
        (lambda p: _scaled(p, _head(0), 1e37), "registration computes in float32"),
        (lambda p: _save(p, _head(0).astype(np.float64) * 1e298), "registration computes in"),
        # issue 57 item 3: pixdim 2 mm, sform scaled x1000
        (_sform_scaled, "disagree with the header's pixdim"),
    ],
    ids=["slope-1e37", "float64-1e300", "sform-x1000"],
)
def test_inputs_that_would_break_registration_are_refused_on_reading(tmp_path, make, message):
    d = tmp_path / "bad"
    d.mkdir()
    make(d / "b.nii.gz")
    with pytest.raises(DataFormatError, match=message):
        load_volume_folder(d)


def test_a_big_endian_file_reads_with_its_values(tmp_path: Path) -> None:
    header = nib.Nifti1Header(endianness=">")
    header.set_data_dtype(np.int16)
    nib.save(nib.Nifti1Image(_head(2), np.diag([2.0, 2.0, 2.0, 1.0]), header), tmp_path / "b.nii")
    vol = read_volume(tmp_path / "b.nii")
    assert vol.data.dtype == np.dtype(">i2") and np.array_equal(vol.data, _head(2))
    out = tmp_path / "out.nii.gz"
    write_volume(vol, out)  # written little-endian (nibabel's and most consumers' order)
    back = read_volume(out)
    assert back.data.dtype == np.dtype("<i2") and np.array_equal(back.data, vol.data)


def test_volumes_take_no_labels(folder, store) -> None:
    with pytest.raises(DataFormatError, match="carry no class labels"):
        register_from_source(store, "heads", str(folder), 10.0, 1e-5, labels="0-1")
