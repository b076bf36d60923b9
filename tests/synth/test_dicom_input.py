"""DICOM studies, fast: series grouped, localizers and derived series skipped by rule, the rest
converted by dcm2niix into a BIDS tree whose sidecars are scrubbed on reading, and a series with
a missing slice refused by name. Small pydicom-written series of random voxels, with PatientName,
dates, UIDs, an institution and a serial in their headers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from accounting.errors import DataFormatError
from synth.kinds import dicom
from synth.kinds.volume import Volume
from tests.support.bids_heads import PHI, leaked, write_series

pytestmark = pytest.mark.skipif(
    shutil.which("dcm2niix") is None, reason="dcm2niix (Debian package dcm2niix) is not installed"
)


def _study(root: Path, patients: int, *, drop: int | None = None) -> Path:
    rng = np.random.default_rng(1)
    for p in range(1, patients + 1):
        vol = Volume(rng.integers(0, 300, (16, 14, 10)).astype(np.int16), np.diag([3, 3, 4, 1.0]))
        study = f"1.2.826.0.1.3680043.10.999.{p}.77"
        folder = root / f"ROE_JANE_{p}"
        for number, what, kind in (
            (1, "localizer", ("ORIGINAL", "PRIMARY", "M")),
            (2, "T1 MPRAGE", ("ORIGINAL", "PRIMARY", "M")),
            (3, "T2 SPACE", ("ORIGINAL", "PRIMARY", "M")),
            (4, "T1 MPR tra", ("DERIVED", "SECONDARY", "MPR")),
            (5, "DWI b1000", ("ORIGINAL", "PRIMARY", "M")),
        ):
            write_series(
                folder / str(number),
                vol,
                patient=p,
                study_uid=study,
                series_number=number,
                description=what,
                image_type=kind,
                drop_slice=4 if (drop == p and number == 2) else None,
            )
    return root


def test_study_converted_into_bids_with_skips_recorded(tmp_path) -> None:
    tree, conversion = dicom.convert_study(_study(tmp_path / "study", 2))
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*.nii.gz")) == [
        "sub-01/anat/sub-01_T1w.nii.gz",
        "sub-01/anat/sub-01_T2w.nii.gz",
        "sub-02/anat/sub-02_T1w.nii.gz",
        "sub-02/anat/sub-02_T2w.nii.gz",
    ]
    assert conversion["series_converted"] == {"T1w": 2, "T2w": 2}
    assert conversion["series_skipped"] == {"derived": 2, "localizer": 2, "not T1w/T2w": 2}
    assert conversion["tool"] == "dcm2niix" and conversion["version"].startswith("v1.")
    assert oct(tree.stat().st_mode & 0o777) == "0o700"
    assert not list(tree.rglob("*.dcm"))  # the DICOM files are never copied


def test_loaded_study_keeps_no_identifier(tmp_path) -> None:
    data = dicom.load_dicom(f"dicom:{_study(tmp_path / 'study', 5)}")
    assert len(data) == 10 and len(set(data.subjects)) == 5
    assert data.source == f"dicom:{tmp_path / 'study'}"
    text = json.dumps(data.layout.summary()) + repr(data.layout.records)
    assert not [v for v in PHI if v.lower() in text.lower()]
    kept = dict(data.layout.records[0].sidecar)
    assert kept["RepetitionTime"] == 2.3 and kept["Manufacturer"] == "Siemens"
    assert "InstitutionName" in data.layout.dropped_fields
    assert not leaked(tmp_path / "study", ["sub-01"])  # nothing written into the source folder


def test_a_series_with_a_missing_slice_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(
        DataFormatError,
        match=r"ROE_JANE_2/2 \(series 2, T1 MPRAGE\): "
        r"missing slices \(instance number\(s\) \[5\] absent from 1..10\)",
    ):
        dicom.convert_study(_study(tmp_path / "study", 2, drop=2))


def test_no_dicom_and_no_dcm2niix_are_refused(tmp_path, monkeypatch) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hello")
    with pytest.raises(DataFormatError, match=r"no DICOM files with a SeriesInstanceUID \(1 other"):
        dicom.convert_study(tmp_path / "empty")
    monkeypatch.setattr(dicom, "DCM2NIIX", "dcm2niix-not-installed")
    with pytest.raises(DataFormatError, match="dcm2niix is not installed"):
        dicom.convert_study(tmp_path / "empty")


def test_a_study_of_localizers_only_is_refused(tmp_path) -> None:
    vol = Volume(np.full((16, 14, 10), 7, np.int16), np.diag([3, 3, 4, 1.0]))
    write_series(
        tmp_path / "study" / "1",
        vol,
        patient=1,
        study_uid="1.2.3",
        series_number=1,
        description="3-plane localizer",
    )
    with pytest.raises(DataFormatError, match=r"none of its 1 series .*'localizer': 1"):
        dicom.convert_study(tmp_path / "study")


def test_a_series_dcm2niix_cannot_make_one_volume_of_is_named_with_its_reason(tmp_path) -> None:
    import pydicom

    root = _study(tmp_path / "study", 1)
    odd = root / "ROE_JANE_1" / "2" / "IM0005.dcm"  # one slice of another size
    ds = pydicom.dcmread(odd)
    ds.Rows = 7
    ds.PixelData = ds.PixelData[: 7 * 16 * 2]
    ds.save_as(odd)
    with pytest.raises(
        DataFormatError,
        match=r"ROE_JANE_1/2 \(series 2, T1 MPRAGE\): dcm2niix could not convert "
        r"it into one volume \(exit \d+, \d+ image\(s\); it said: .+\)\. Remove the series",
    ):
        dicom.convert_study(root)
