"""BIDS sources, fast: parsing the selection, scrubbing sidecars, counting subjects (one subject,
whatever its sessions, is one privacy unit) and every refusal naming what was wrong, before any
voxel is read and before anything is registered. Tiny random volumes stand in for heads: nothing
here runs a registration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from accounting.errors import DataFormatError
from synth.kinds.bids import is_bids_source, load_bids, parse_source, read_layout, scrub
from synth.kinds.datasets import is_volume_source
from synth.kinds.nifti import write_volume
from synth.kinds.volume import Volume


def _tree(
    root: Path,
    subjects: int = 5,
    sessions: int = 2,
    suffixes: tuple[str, ...] = ("T1w", "T2w"),
    *,
    skip: tuple[str, str, str] | None = None,
) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    (root / "dataset_description.json").write_text('{"Name": "t", "BIDSVersion": "1.9.0"}')
    rows = ["participant_id\tage\tname"]
    for i in range(1, subjects + 1):
        rows.append(f"sub-{i:02d}\t{40 + i}\tJane Q Roe")
        for ses in range(1, sessions + 1):
            anat = root / f"sub-{i:02d}" / f"ses-{ses}" / "anat"
            anat.mkdir(parents=True)
            for suffix in suffixes:
                if skip == (f"{i:02d}", str(ses), suffix):
                    continue
                stem = f"sub-{i:02d}_ses-{ses}_{suffix}"
                data = rng.integers(0, 200, (12, 12, 12)).astype(np.int16)
                write_volume(Volume(data, np.diag([2.0, 2.0, 2.0, 1.0])), anat / f"{stem}.nii.gz")
                sidecar = {"EchoTime": 0.003, "AcquisitionDateTime": "2024-01-17T09:14:03"}
                if i == 1:  # a key someone typed: counted, never named
                    sidecar["note for Jane Q Roe"] = "x"
                (anat / f"{stem}.json").write_text(json.dumps(sidecar))
    (root / "participants.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_sources_are_recognised_by_prefix_or_dataset_description(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 1, 1)
    assert is_bids_source(str(tree)) and is_bids_source(f"bids:{tree}")
    assert is_volume_source(f"bids:{tree}") and is_volume_source(f"dicom:{tmp_path}")
    assert not is_bids_source(str(tmp_path)) and not is_bids_source("builtin:mnist5k")


def test_selection_parses_entities_suffixes_and_participants() -> None:
    q = parse_source("bids:/data/ds?suffix=T1w&ses=ses-1,2&participants=age,sex")
    assert q.root == Path("/data/ds") and q.suffixes == ("T1w",)
    assert q.entities == {"ses": ("1", "2")} and q.participants == ("age", "sex")
    assert parse_source("bids:/data/ds").suffixes == ("T1w", "T2w")
    with pytest.raises(DataFormatError, match="unknown selection 'subject'"):
        parse_source("bids:/data/ds?subject=01")


def test_scrub_keeps_acquisition_parameters_and_drops_everything_else() -> None:
    kept, dropped = scrub(
        {
            "RepetitionTime": 2.3,
            "EchoTime": 0.003,
            "FlipAngle": 9,
            "Manufacturer": "Siemens",
            "ManufacturersModelName": "SN 48213377",  # digits: a serial, not a model name
            "MagneticFieldStrength": True,  # a bool is not a field strength
            "InversionTime": float("nan"),
            "AcquisitionDateTime": "2024-01-17T09:14:03",
            "InstitutionName": "St Elsewhere",
            "DeviceSerialNumber": "48213377",
            "OperatorsName": "Hector",
            "ImageComments": "ROE^JANE",
        }
    )
    assert dict(kept) == {
        "RepetitionTime": 2.3,
        "EchoTime": 0.003,
        "FlipAngle": 9,
        "Manufacturer": "Siemens",
    }
    assert {
        "AcquisitionDateTime",
        "InstitutionName",
        "DeviceSerialNumber",
        "OperatorsName",
        "ImageComments",
        "ManufacturersModelName",
        "MagneticFieldStrength",
        "InversionTime",
    } == dropped


def test_subjects_not_files_are_the_unit(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 5, 2)
    data = load_bids(f"bids:{tree}?participants=age")
    assert len(data) == 20 and len(set(data.subjects)) == 5
    heads = data.subject_heads()
    assert [data.layout.records[i].path for i in heads] == [
        f"sub-{i:02d}/ses-1/anat/sub-{i:02d}_ses-1_T1w.nii.gz" for i in range(1, 6)
    ]
    assert dict(data.layout.participants) == {f"{i:02d}": (str(40 + i),) for i in range(1, 6)}
    summary = data.layout.summary()
    assert summary["subjects"] == 5 and summary["sessions"] == 10
    assert summary["sidecar_fields_kept"] == ["EchoTime"]
    assert summary["sidecar_fields_dropped"] == ["AcquisitionDateTime", "1 other field(s)"]
    only = load_bids(f"bids:{tree}?suffix=T1w&ses=1")
    assert len(only) == 5 and {r.suffix for r in only.layout.records} == {"T1w"}


def test_four_subjects_in_two_sessions_are_refused(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 4, 2)
    with pytest.raises(DataFormatError, match=r"4 subjects \(16 images in 8 subject/session"):
        read_layout(parse_source(f"bids:{tree}"))


def test_no_dataset_description_is_refused(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 5, 1)
    (tree / "dataset_description.json").unlink()
    with pytest.raises(DataFormatError, match="not a BIDS dataset: no dataset_description.json"):
        load_bids(f"bids:{tree}")


def test_a_sidecar_that_is_not_json_is_named(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 5, 1)
    bad = tree / "sub-03/ses-1/anat/sub-03_ses-1_T2w.json"
    bad.write_text("{'EchoTime': 0.1,")
    with pytest.raises(DataFormatError, match=r"sub-03_ses-1_T2w.json: the JSON sidecar is not "):
        load_bids(f"bids:{tree}")


def test_a_subject_missing_its_t1w_in_a_mixed_set_is_refused(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 5, 1, skip=("04", "1", "T1w"))
    with pytest.raises(DataFormatError, match=r"sub-04/ses-1 has no T1w image while 4 other"):
        load_bids(f"bids:{tree}")
    assert len(load_bids(f"bids:{tree}?suffix=T2w")) == 5  # what every subject has


def test_participants_columns_must_exist(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 5, 1)
    with pytest.raises(DataFormatError, match=r"has no column\(s\) \['sex'\]"):
        load_bids(f"bids:{tree}?participants=sex")


def test_nothing_selected_is_refused(tmp_path) -> None:
    tree = _tree(tmp_path / "ds", 5, 1)
    with pytest.raises(DataFormatError, match="no FLAIR image"):
        load_bids(f"bids:{tree}?suffix=FLAIR")


def test_refused_registration_stores_nothing(tmp_path, store) -> None:
    from accounting import ledger
    from release.data import register_from_source

    tree = _tree(tmp_path / "ds", 4, 2)
    with pytest.raises(DataFormatError, match="4 subjects"):
        register_from_source(store, "heads", f"bids:{tree}", 10.0, 1e-5)
    assert ledger.list_datasets(store) == []


def test_rekeyed_labels_follow_the_key_and_keep_each_volume_with_its_record(tmp_path) -> None:
    from synth.kinds.bids import label_map
    from synth.kinds.nifti import read_volume

    tree = _tree(tmp_path / "ds", 6, 2)
    loaded = load_bids(f"bids:{tree}?rekey=true&participants=age")
    assert load_bids(f"bids:{tree}").with_key(b"k" * 32).layout.rekeyed is False  # not asked
    a, b = loaded.with_key(b"a" * 32), loaded.with_key(b"b" * 32)
    assert a.layout.rekeyed and a.layout.summary()["subject_labels"].startswith("re-keyed")
    assert sorted(set(a.subjects)) == [f"{i:02d}" for i in range(1, 7)]
    assert label_map(loaded.subjects, b"a" * 32) != label_map(loaded.subjects, b"b" * 32)
    back = {new: old for old, new in label_map(sorted(set(loaded.subjects)), b"a" * 32).items()}
    paths = [r.path for r in a.layout.records]
    assert paths == sorted(paths)  # the row order follows the new labels, not the source's
    for record, ref in zip(a.layout.records, a.records, strict=True):
        old = back[record.subject]
        source = tree / record.path.replace(f"sub-{record.subject}", f"sub-{old}")
        assert read_volume(source).digest() == ref.sha256
    ages = dict(a.layout.participants)
    assert ages == {new: (str(40 + int(old)),) for new, old in back.items()}
    assert a.layout.digest() != b.layout.digest()  # the fingerprint follows the labels


def test_fingerprint_covers_sidecars_and_the_unit_is_a_subject(tmp_path) -> None:
    from synth.kinds import inputs

    tree = _tree(tmp_path / "ds", 5, 1)
    kind = inputs.for_source(f"bids:{tree}")
    data = kind.load(f"bids:{tree}")
    assert kind.name == "volumes" and kind.unit(data).startswith("one subject")
    before = kind.fingerprint(b"k" * 32, data)
    sidecar = tree / "sub-02/ses-1/anat/sub-02_ses-1_T1w.json"
    sidecar.write_text(json.dumps({"EchoTime": 0.004}))  # a released value changed
    assert kind.fingerprint(b"k" * 32, kind.load(f"bids:{tree}")) != before
    # a dropped field's value is not released (its name is, on the card): no change
    sidecar.write_text(json.dumps({"EchoTime": 0.003, "AcquisitionDateTime": "2025-02-02"}))
    assert kind.fingerprint(b"k" * 32, kind.load(f"bids:{tree}")) == before
