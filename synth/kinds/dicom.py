"""Reading a DICOM study (`dicom:/data/study`): its series converted by dcm2niix into a BIDS tree
first, then read like any BIDS dataset (synth.kinds.bids).

The DICOM headers are read with pydicom (no pixel data) to group files into series (by
SeriesInstanceUID), series into sessions (studies, ordered by date) and sessions into subjects
(ordered by PatientID: sub-01, sub-02, ...; no DICOM identifier becomes a label). Localizers
(scouts, surveys) and derived series (ImageType DERIVED: reformats, maps) are skipped by rule; a
series whose description or protocol names no T1- or T2-weighted contrast is skipped and counted.
A series with missing slices, or one dcm2niix cannot convert, refuses the whole study with the
series named and why, before anything is registered.

The converted tree lives in a private temporary folder (0700) for the life of the process, is
made again (identically) whenever the source is read, and holds dcm2niix's sidecars, which the
BIDS reading scrubs to its allow-list: names, dates, UIDs, institutions and serial numbers never
reach a release, and the DICOM files themselves are never copied.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accounting.errors import DataFormatError

PREFIX = "dicom:"
DCM2NIIX = "dcm2niix"
TIMEOUT_S = 600  # one series' conversion
LOCALIZER = re.compile(r"locali[sz]er|scout|survey|aahead|3-?plane", re.I)
CONTRASTS = (
    ("T1w", re.compile(r"t1|mprage|mp-rage|spgr|bravo|tfl", re.I)),
    ("T2w", re.compile(r"t2(?!\*)|tse|space", re.I)),
)
SPACING_TOLERANCE = 0.05  # relative: slice positions further from even spacing mean missing slices


def is_dicom_source(source: str) -> bool:
    return source.startswith(PREFIX)


@dataclass
class Series:
    """One DICOM series: its files and the header fields that place and classify it."""

    uid: str
    folder: str  # where its first file lies (for messages)
    patient: str
    study: str
    study_date: str
    number: int
    description: str
    image_type: tuple[str, ...]
    files: list[tuple[int, Path, np.ndarray, np.ndarray]]  # (instance, file, position, normal)


def _read_headers(root: Path) -> tuple[dict[str, Series], int]:
    """The study's series, and how many files were not DICOM (skipped)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    series: dict[str, Series] = {}
    other = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
        except (InvalidDicomError, OSError, ValueError, EOFError):
            other += 1
            continue
        uid = str(getattr(ds, "SeriesInstanceUID", "") or "")
        if not uid:
            other += 1
            continue
        orient = np.asarray(getattr(ds, "ImageOrientationPatient", [1, 0, 0, 0, 1, 0]), float)
        normal = np.cross(orient[:3], orient[3:]) if orient.size == 6 else np.zeros(3)
        position = np.asarray(getattr(ds, "ImagePositionPatient", [0, 0, 0]), float)
        s = series.get(uid)
        if s is None:
            s = series[uid] = Series(
                uid,
                str(path.parent.relative_to(root)),
                str(getattr(ds, "PatientID", "") or ""),
                str(getattr(ds, "StudyInstanceUID", "") or ""),
                str(getattr(ds, "StudyDate", "") or ""),
                int(getattr(ds, "SeriesNumber", 0) or 0),
                " ".join(
                    dict.fromkeys(  # the description, and the protocol where it differs
                        str(getattr(ds, k, "") or "").strip()
                        for k in ("SeriesDescription", "ProtocolName")
                    )
                ).strip(),
                tuple(str(t).upper() for t in (getattr(ds, "ImageType", None) or ())),
                [],
            )
        s.files.append((int(getattr(ds, "InstanceNumber", 0) or 0), path, position, normal))
    return series, other


def _skip_reason(s: Series) -> str | None:
    if "LOCALIZER" in s.image_type or LOCALIZER.search(s.description):
        return "localizer"
    if s.image_type and s.image_type[0] == "DERIVED":
        return "derived"
    if _contrast(s) is None:
        return "not T1w/T2w"
    return None


def _contrast(s: Series) -> str | None:
    for suffix, pattern in CONTRASTS:
        if pattern.search(s.description):
            return suffix
    return None


def _check_slices(s: Series, root: Path) -> None:
    """Refuse a series with missing slices: instance numbers with gaps, or slice positions that
    are not evenly spaced along the slice normal."""
    name = f"{root}/{s.folder} (series {s.number}, {s.description or 'no description'})"
    instances = sorted(i for i, *_ in s.files)
    if len(s.files) < 3:
        raise DataFormatError(f"{name}: {len(s.files)} slice(s); a head scan needs a volume.")
    gaps = sorted(set(range(instances[0], instances[-1] + 1)) - set(instances))
    along = np.sort([float(pos @ normal) for _, _, pos, normal in s.files])
    steps = np.diff(along)
    step = float(np.median(steps))
    uneven = step <= 0 or bool(np.any(np.abs(steps - step) > SPACING_TOLERANCE * step))
    if gaps or uneven:
        what = (
            f"instance number(s) {gaps[:10]} absent from {instances[0]}..{instances[-1]}"
            if gaps
            else f"slice spacing varies from {steps.min():.3g} to {steps.max():.3g} mm"
        )
        raise DataFormatError(
            f"{name}: missing slices ({what}); dcm2niix would interpolate over the gap or split "
            "the series. Export the complete series again from the scanner or PACS, or remove "
            "it from the folder. Nothing was registered."
        )


def dcm2niix_version() -> str:
    exe = shutil.which(DCM2NIIX)
    if exe is None:
        raise DataFormatError(
            "dcm2niix is not installed; a dicom: source is converted with it. Install the Debian "
            "package `dcm2niix` (apt-get install dcm2niix), or convert the study to BIDS yourself "
            "and register it with bids:."
        )
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=60)
    found = re.search(r"v\d+\.\d+\.\d+\w*", out.stdout + out.stderr)
    return found.group(0) if found else "unknown"


def _convert(s: Series, target: Path, root: Path, work: Path) -> None:
    """One series with dcm2niix (gzip, anonymised sidecar) into `target` (.nii.gz and .json)."""
    src = work / "in"
    out = work / "out"
    for d in (src, out):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for k, (_, path, _, _) in enumerate(s.files):  # links: the DICOM files are never copied
        (src / f"{k:05d}.dcm").symlink_to(path.resolve())
    cmd = [DCM2NIIX, "-b", "y", "-ba", "y", "-z", "y", "-f", "image", "-o", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    images = sorted(out.glob("*.nii.gz"))
    name = f"{root}/{s.folder} (series {s.number}, {s.description or 'no description'})"
    if done.returncode != 0 or len(images) != 1:
        lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.lower().startswith(("warning", "error"))] or lines[-1:]
        raise DataFormatError(
            f"{name}: dcm2niix could not convert it into one volume (exit {done.returncode}, "
            f"{len(images)} image(s); it said: {' / '.join(said[:3]) or 'nothing'}). Remove the "
            "series or export it again. Nothing was registered."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(images[0], target.with_name(target.name + ".nii.gz"))
    sidecar = images[0].with_name("image.json")
    if sidecar.is_file():
        shutil.move(sidecar, target.with_name(target.name + ".json"))


_TREES: list[Path] = []  # this process's converted trees, removed when it ends


def _remove_trees() -> None:
    for tree in _TREES:
        shutil.rmtree(tree, ignore_errors=True)


def _private_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="privrelease-dicom-"))
    os.chmod(folder, 0o700)
    if not _TREES:
        atexit.register(_remove_trees)
    _TREES.append(folder)
    return folder


def _places(kept: list[Series]) -> dict[str, tuple[str, str, str]]:
    """Each kept series' (subject, session, suffix) labels: subjects numbered in PatientID order,
    sessions (only where a patient has several studies) in study date order."""
    patients = sorted({s.patient for s in kept})
    subject = {p: f"{i + 1:02d}" for i, p in enumerate(patients)}
    studies: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for s in kept:
        if (s.study_date, s.study) not in studies[s.patient]:
            studies[s.patient].append((s.study_date, s.study))
    several = any(len(v) > 1 for v in studies.values())

    def session(s: Series) -> str:
        return str(sorted(studies[s.patient]).index((s.study_date, s.study)) + 1) if several else ""

    return {s.uid: (subject[s.patient], session(s), _contrast(s) or "T1w") for s in kept}


def convert_study(root: Path) -> tuple[Path, dict[str, Any]]:
    """The study converted into a BIDS tree (a private temporary folder) and what the card says
    of the conversion."""
    if not root.is_dir():
        raise DataFormatError(f"{root}: no such folder.")
    version = dcm2niix_version()
    series, other = _read_headers(root)
    if not series:
        raise DataFormatError(
            f"{root}: no DICOM files with a SeriesInstanceUID ({other} other file(s)); point "
            "dicom: at the folder holding the study's series."
        )
    skipped: dict[str, int] = defaultdict(int)
    kept = []
    for s in sorted(series.values(), key=lambda s: (s.patient, s.study_date, s.study, s.number)):
        why = _skip_reason(s)
        if why:
            skipped[why] += 1
        else:
            _check_slices(s, root)
            kept.append(s)
    if not kept:
        raise DataFormatError(
            f"{root}: none of its {len(series)} series is a T1- or T2-weighted head scan "
            f"(skipped: {dict(skipped)}); nothing to register."
        )
    tree = _private_folder()
    work = _private_folder()  # dcm2niix's input links and output, one series at a time
    places = _places(kept)
    runs = Counter(places.values())  # several series of one contrast in a session: run-1, ...
    seen: dict[tuple[str, str, str], int] = defaultdict(int)
    converted: dict[str, int] = defaultdict(int)
    for s in kept:
        sub, ses, suffix = key = places[s.uid]
        seen[key] += 1
        run = f"_run-{seen[key]}" if runs[key] > 1 else ""
        folder = tree / f"sub-{sub}" / (f"ses-{ses}" if ses else "") / "anat"
        stem = f"sub-{sub}" + (f"_ses-{ses}" if ses else "") + f"{run}_{suffix}"
        _convert(s, folder / stem, root, work)
        converted[suffix] += 1
    (tree / "dataset_description.json").write_text(
        json.dumps({"Name": "DICOM study converted by dcm2niix", "BIDSVersion": "1.9.0"})
    )
    shutil.rmtree(work, ignore_errors=True)
    return tree, {
        "tool": "dcm2niix",
        "version": version,
        "series_converted": dict(sorted(converted.items())),
        "series_skipped": dict(sorted(skipped.items())),
        "files_not_dicom": other,
        "series_descriptions": "not kept (sidecars scrubbed to acquisition parameters)",
        "subject_labels": "sub-01.. in PatientID order (no DICOM identifier is a label)",
    }


def load_dicom(source: str) -> Any:
    """A DICOM study as a VolumeDataset (its converted BIDS tree read by synth.kinds.bids)."""
    from synth.kinds.bids import PREFIX as BIDS
    from synth.kinds.bids import load_bids

    text = source.removeprefix(PREFIX)
    path, _, query = text.partition("?")
    tree, conversion = convert_study(Path(path))
    data = load_bids(f"{BIDS}{tree}" + (f"?{query}" if query else ""), conversion)
    data.source = source
    return data
