"""A registered folder of heads held by reference (issue 56): each file read once, one at a time, to
take its digest; the registered fingerprint computed from those digests equals the one over the
volumes' bytes; a head is read again whenever it is used, never kept, and refused (naming its file)
once it is not the content that was checked."""

from __future__ import annotations

import gc
import hashlib
import pickle
import weakref
from pathlib import Path

import numpy as np
import pytest

from accounting.errors import DataFormatError, DatasetConflictError
from accounting.fingerprint import volume_digests_fingerprint, volumes_fingerprint
from synth.kinds.nifti import (
    VolumeFile,
    load_volume_folder,
    read_volume,
    saved_file,
    write_volume,
)
from synth.kinds.volume import Volume, VolumeDataset, VolumeRef, open_record

N = 4
KEY = b"k" * 32


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "heads"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(N):
        data = rng.integers(0, 1000, (24, 28, 20), dtype=np.int16)
        write_volume(Volume(data, np.diag([2.0, 2.0, 2.0, 1.0])), folder / f"s{i}.nii.gz")
    return folder


def _changed(path: Path) -> None:
    """The same head with one voxel changed, written over its file."""
    vol = read_volume(path)
    data = vol.data.copy()
    data[3, 4, 5] += 1
    write_volume(vol.with_data(data), path)


def test_a_folder_is_held_by_reference_in_record_order(tmp_path) -> None:
    folder = _folder(tmp_path)
    data = load_volume_folder(folder)
    files = sorted(folder.glob("*.nii.gz"))
    assert [r.path for r in data.records] == [f.resolve() for f in files]
    assert all(isinstance(r, VolumeFile) and r.path.is_absolute() for r in data.records)
    for record, volume, f in zip(data.records, data.volumes, files, strict=True):
        expected = read_volume(f)
        assert volume.stored_bytes() == expected.stored_bytes()
        assert record.sha256 == hashlib.sha256(expected.stored_bytes()).hexdigest()
        assert record.shape == expected.shape and record.nbytes == expected.data.nbytes
    assert data.image_shape == (24, 28, 20) and len(data) == N
    assert data.stored_nbytes == N * 24 * 28 * 20 * 2


def test_the_fingerprint_from_digests_is_the_one_over_the_volumes_bytes(tmp_path) -> None:
    data = load_volume_folder(_folder(tmp_path))
    in_memory = VolumeDataset(list(data.volumes), data.source)
    over_bytes = volumes_fingerprint(KEY, [v.stored_bytes() for v in in_memory.volumes])
    assert volume_digests_fingerprint(KEY, data.record_digests()) == over_bytes
    assert volume_digests_fingerprint(KEY, in_memory.record_digests()) == over_bytes


def test_the_dataset_keeps_no_voxels_and_a_record_is_small(tmp_path) -> None:
    """What the coordinator holds, and what a task carries, is the reference: no array survives
    an iteration over the dataset, and a pickled record is a few hundred bytes."""
    data = load_volume_folder(_folder(tmp_path))
    arrays = []
    for volume in data.volumes:
        arrays.append(weakref.ref(volume.data))
    del volume
    gc.collect()
    assert len(arrays) == N and all(a() is None for a in arrays)
    for record in data.records:
        assert isinstance(record, VolumeRef)
        assert len(pickle.dumps(record)) < 1024 < record.nbytes


def test_a_head_changed_after_the_check_is_refused_naming_its_file(tmp_path) -> None:
    folder = _folder(tmp_path)
    data = load_volume_folder(folder)
    _changed(folder / "s2.nii.gz")
    assert open_record(data.records[1]).stored_bytes() == data[1].stored_bytes()  # others read
    with pytest.raises(DatasetConflictError, match=r"s2\.nii\.gz: the file changed since.*Restore"):
        data[2]
    with pytest.raises(DatasetConflictError, match=r"s2\.nii\.gz"):
        list(data.volumes)
    (folder / "s3.nii.gz").unlink()
    with pytest.raises(DatasetConflictError, match=r"s3\.nii\.gz: the file is gone.*Restore"):
        open_record(data.records[3])


def test_a_folder_over_the_old_whole_dataset_cap_registers_a_file_over_the_file_cap_does_not(
    tmp_path, monkeypatch
) -> None:
    """The folder's total is not bounded (its heads are held by reference); one file is, at
    MAX_FILE_BYTES, refused before its voxels are decoded, saying what to do. A small patched
    limit stands for 1 GiB: the folder holds N times one file's bytes."""
    from synth.kinds import nifti

    folder = _folder(tmp_path)
    one = 24 * 28 * 20 * 2
    monkeypatch.setattr(
        nifti, "MAX_FILE_BYTES", one
    )  # every file at the limit, the folder N times it
    data = load_volume_folder(folder)
    assert len(data) == N and data.stored_nbytes == N * one > nifti.MAX_FILE_BYTES
    monkeypatch.setattr(nifti, "MAX_FILE_BYTES", one - 1)
    with pytest.raises(
        DataFormatError, match=r"s0\.nii\.gz: 24x28x20 voxels of int16 hold 26,880 bytes.*Resample"
    ):
        load_volume_folder(folder)
    with pytest.raises(DataFormatError, match=r"more than the 26,879 a head scan may hold"):
        read_volume(folder / "s1.nii.gz")  # a worker reading the file checks it too


def test_a_saved_release_file_is_read_when_used_and_refused_once_changed(tmp_path) -> None:
    """A saved release read back by reference: header and file hash now, voxels when used."""
    folder = _folder(tmp_path)
    ref = saved_file(folder / "s1.nii.gz")
    expected = read_volume(folder / "s1.nii.gz")
    assert (
        isinstance(ref, VolumeRef) and ref.shape == (24, 28, 20) and ref.nbytes == 24 * 28 * 20 * 2
    )
    assert ref.read().stored_bytes() == expected.stored_bytes()
    assert ref.sha256 == hashlib.sha256(expected.stored_bytes()).hexdigest()
    _changed(folder / "s1.nii.gz")
    with pytest.raises(DatasetConflictError, match=r"s1\.nii\.gz: the released file changed"):
        ref.read()


def test_a_released_head_is_read_back_from_its_item_file_and_refused_once_changed(
    tmp_path,
) -> None:
    """deface/reface's output held by reference to the run's item files (ReleasedHead)."""
    from release.executor import ItemStore, StoredResults
    from synth.mechanisms.deface_reface.run import ReleasedHead

    head = read_volume(_folder(tmp_path) / "s0.nii.gz")
    store = ItemStore(tmp_path / "items")
    store.save(0, (head, {"seconds": 1.0}))
    digest = hashlib.sha256(head.stored_bytes()).hexdigest()
    ref = ReleasedHead(StoredResults(store, 1), 0, head.name, digest, head.shape, 24 * 28 * 20 * 2)
    released = VolumeDataset.by_reference([ref], "release")
    assert isinstance(ref, VolumeRef) and released.record_digests() == [bytes.fromhex(digest)]
    assert released[0].stored_bytes() == head.stored_bytes()
    data = head.data.copy()
    data[1, 2, 3] += 1
    store.save(0, (head.with_data(data), {"seconds": 1.0}))
    with pytest.raises(DatasetConflictError, match=r"released head 0: its item file .* changed"):
        released[0]
