"""Synthetic BIDS datasets and DICOM studies of SYNTHETIC heads for tests (helpers, not tests):
the cohort of tests/support/heads.py laid out as sub-*/ses-*/anat/ with T1w and T2w images and
sidecars full of identifying-looking values, or written as DICOM series with pydicom carrying
PatientName, dates, UIDs and an institution. `PHI` lists every such value a release must not carry
(`leaked` looks for them in every byte of a folder)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np

from synth.kinds.nifti import read_volume, write_volume
from synth.kinds.volume import Volume
from tests.support.heads import cohort

# values no release may carry (as written in sidecars, participants.tsv and DICOM headers)
PHI = [
    "Jane Q Roe",
    "ROE^JANE",
    "St Elsewhere General Hospital",
    "Dr Hector Operator",
    "SN48213377",
    "2024-01-17",
    "20240117",
    "09:14:03",
    "19610302",
    "MRN00",
    "1.2.826.0.1.3680043.10.999",
]
UID_ROOT = "1.2.826.0.1.3680043.10.999."


def t2_like(v: Volume) -> Volume:
    """A second contrast of the same head (a monotone change of its intensities, mid tones
    darkened): not a real T2 contrast. The mechanisms' and the audit's templates are T1-weighted;
    at the tests' 6 mm an inverted contrast made the audit's registration of Colin27 find a brain a
    fifth too large (the audit then rightly failed a release that changed one of its voxels), and
    lifted darks made one head fit best turned (refused at registration)."""
    x = np.maximum(v.physical(), 0)
    hi = float(x.max())
    return v.with_data(v.to_stored(hi * (x / hi) ** 1.3))


def _session(v: Volume, ses: int) -> Volume:
    """Another session's scan of the same head: the same anatomy, a slightly different gain."""
    if ses == 1:
        return v
    return v.with_data(v.to_stored(v.physical() * (1.0 + 0.03 * ses)))


def _sidecar(sub: int, ses: int, suffix: str) -> dict:
    return {
        "RepetitionTime": 2.3 if suffix == "T1w" else 3.2,
        "EchoTime": 0.00298 if suffix == "T1w" else 0.408,
        "FlipAngle": 9 if suffix == "T1w" else 120,
        "MagneticFieldStrength": 3,
        "Manufacturer": "Siemens",
        "ManufacturersModelName": "Prisma fit",
        "AcquisitionDateTime": f"2024-01-17T09:14:03.{sub}{ses}",
        "InstitutionName": "St Elsewhere General Hospital",
        "OperatorsName": "Dr Hector Operator",
        "DeviceSerialNumber": "SN48213377",
        "PatientName": "Jane Q Roe",
        "StudyInstanceUID": f"{UID_ROOT}{sub}.{ses}",
        "SeriesDescription": "T1 MPRAGE for Jane Q Roe" if suffix == "T1w" else "T2 SPACE",
        "ImageComments": "ROE^JANE 20240117",
        "Dummy": None,
    }


def bids_dataset(
    root: Path,
    subjects: int = 8,
    sessions: int = 2,
    suffixes: tuple[str, ...] = ("T1w", "T2w"),
    *,
    seed: int = 0,
    colin_only: bool = False,
) -> Path:
    """A BIDS dataset of `subjects` synthetic subjects x `sessions` sessions x `suffixes`
    (`colin_only`: every head made from Colin27, none from the template reface's face comes
    from, as tests/release/test_volumes_e2e.py does for reface)."""
    made = cohort(root.parent / f"{root.name}-cohort", subjects, seed=seed, colin_only=colin_only)
    heads = sorted(made.glob("*.nii*"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(
        json.dumps({"Name": "Synthetic heads", "BIDSVersion": "1.9.0", "Authors": ["Jane Q Roe"]})
    )
    rows = ["participant_id\tage\tsex\tname\tbirthdate"]
    for i, head in enumerate(heads, start=1):
        base = read_volume(head)
        sub = f"{i:02d}"
        rows.append(f"sub-{sub}\t{30 + i}\t{'MF'[i % 2]}\tJane Q Roe\t19610302")
        for ses in range(1, sessions + 1):
            folder = root / f"sub-{sub}" / (f"ses-{ses}" if sessions > 1 else "") / "anat"
            folder.mkdir(parents=True, exist_ok=True)
            for suffix in suffixes:
                stem = f"sub-{sub}" + (f"_ses-{ses}" if sessions > 1 else "") + f"_{suffix}"
                vol = _session(base, ses)
                write_volume(t2_like(vol) if suffix == "T2w" else vol, folder / f"{stem}.nii.gz")
                (folder / f"{stem}.json").write_text(json.dumps(_sidecar(i, ses, suffix)))
    (root / "participants.tsv").write_text("\n".join(rows) + "\n")
    return root


# ---------------------------------------------------------------- DICOM
def _lps(v: np.ndarray) -> np.ndarray:
    return np.array([-v[0], -v[1], v[2]])


def write_series(
    folder: Path,
    volume: Volume,
    *,
    patient: int,
    study_uid: str,
    series_number: int,
    description: str,
    image_type: tuple[str, ...] = ("ORIGINAL", "PRIMARY", "M", "ND"),
    drop_slice: int | None = None,
) -> None:
    """One DICOM series (MR Image Storage, one file a slice along the volume's third axis),
    headers full of identifying-looking values."""
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage

    folder.mkdir(parents=True, exist_ok=True)
    a = volume.affine
    zooms = np.sqrt((a[:3, :3] ** 2).sum(0))
    x, y, z = (_lps(a[:3, k]) / zooms[k] for k in range(3))
    data = volume.data.astype(np.int16)
    series_uid = f"{study_uid}.{series_number}"
    for k in range(data.shape[2]):
        if k == drop_slice:
            continue
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = MRImageStorage
        meta.MediaStorageSOPInstanceUID = f"{series_uid}.{k + 1}"
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = pydicom.Dataset()
        ds.file_meta = meta
        ds.SOPClassUID = MRImageStorage
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.Modality = "MR"
        ds.PatientName = "ROE^JANE"
        ds.PatientID = f"MRN00{patient:05d}"
        ds.PatientBirthDate = "19610302"
        ds.StudyDate = ds.SeriesDate = ds.AcquisitionDate = "20240117"
        ds.StudyTime = ds.SeriesTime = "091403"
        ds.InstitutionName = "St Elsewhere General Hospital"
        ds.OperatorsName = "Dr Hector Operator"
        ds.ReferringPhysicianName = "Jane Q Roe"
        ds.DeviceSerialNumber = "SN48213377"
        ds.Manufacturer = "Siemens"
        ds.ManufacturerModelName = "Prisma fit"
        ds.MagneticFieldStrength = 3
        ds.RepetitionTime = 2300
        ds.EchoTime = 2.98
        ds.FlipAngle = 9
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = series_uid
        ds.FrameOfReferenceUID = f"{series_uid}.0"
        ds.SeriesNumber = series_number
        ds.SeriesDescription = description
        ds.ProtocolName = description
        ds.ImageType = list(image_type)
        ds.InstanceNumber = k + 1
        ds.ImageOrientationPatient = [float(v) for v in (*x, *y)]
        ds.ImagePositionPatient = [float(v) for v in _lps((a @ [0, 0, k, 1])[:3])]
        ds.PixelSpacing = [float(zooms[1]), float(zooms[0])]
        ds.SliceThickness = float(zooms[2])
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.Rows, ds.Columns = data.shape[1], data.shape[0]
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
        ds.PixelRepresentation = 1
        ds.PixelData = np.ascontiguousarray(data[:, :, k].T).tobytes()
        ds.save_as(folder / f"IM{k + 1:04d}.dcm", enforce_file_format=True)


def dicom_study(root: Path, subjects: int = 6, *, seed: int = 0, colin_only: bool = False) -> Path:
    """A study folder: per patient a localizer, a T1 MPRAGE, a T2 SPACE and a derived map."""
    made = cohort(root.parent / f"{root.name}-cohort", subjects, seed=seed, colin_only=colin_only)
    heads = sorted(made.glob("*.nii*"))
    for i, head in enumerate(heads, start=1):
        vol = read_volume(head)
        study = f"{UID_ROOT}{i}.77"
        folder = root / f"ROE_JANE_{i}"
        write_series(
            folder / "1",
            vol,
            patient=i,
            study_uid=study,
            series_number=1,
            description="AAHead_Scout localizer",
        )
        write_series(
            folder / "2", vol, patient=i, study_uid=study, series_number=2, description="T1 MPRAGE"
        )
        write_series(
            folder / "3",
            t2_like(vol),
            patient=i,
            study_uid=study,
            series_number=3,
            description="T2 SPACE sag",
        )
        write_series(
            folder / "4",
            vol,
            patient=i,
            study_uid=study,
            series_number=4,
            description="T1 MPRAGE MPR tra",
            image_type=("DERIVED", "SECONDARY", "MPR"),
        )
    (root / "README.txt").write_text("exported by PACS for Jane Q Roe\n")
    return root


# ---------------------------------------------------------------- leak search
def _readable(path: Path, data: bytes) -> list[bytes]:
    """A file's bytes as a reader sees them: gzip and tar unpacked, Parquet decoded."""
    out = [data]
    if path.name.endswith(".gz") and data[:2] == b"\x1f\x8b":
        inner = gzip.decompress(data)
        out.append(inner)
        if path.name.endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for m in tar.getmembers():
                    f = tar.extractfile(m)
                    if f is not None:
                        out += _readable(Path(m.name), f.read())
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        out.append(repr(pq.read_table(io.BytesIO(data)).to_pylist()).encode())
    return out


def leaked(folder: Path, values: list[str] = PHI) -> dict[str, list[str]]:
    """Which of `values` occur (case-insensitive) in which files under `folder`, every byte of
    every file read as stored and unpacked."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        blobs = [b.lower() for b in _readable(path, path.read_bytes())]
        for value in values:
            if any(value.lower().encode() in b for b in blobs):
                found.setdefault(value, []).append(str(path.relative_to(folder)))
    return found
