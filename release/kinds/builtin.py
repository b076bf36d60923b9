"""The built-in output kinds (release.kinds): 2D images (PrivImage, DP-MERF, k-SALSA),
photographs (face-deid's de-identified photos, with their aligned faces as an extra image
column) and head volumes (deface, reface: one NIfTI file per released row, headers stripped).
The one place in release/ that names them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audit.bids_validation import REPORT as VALIDATOR_REPORT
from audit.kinds import kind_audit
from release.kinds import BundleParts, OutputKind, arrays_sha256, files_sha256
from synth.kinds.bids_out import TREE, read_index, write_tree
from synth.kinds.volume import VolumeDataset
from synth.registry import MechanismOutput

VOLUMES_DIR = "volumes"  # a volume release's NIfTI files, in artifacts/REL/ and in the bundle


def volume_names(ids: Sequence[str]) -> list[str]:
    """The released NIfTI files' names: the row ids (the source file names can identify people
    and are never released)."""
    return [f"{i}.nii.gz" for i in ids]


def _volume_files(folder: Path, ids: Sequence[str]) -> list[Path]:
    """The released NIfTI files: at their BIDS paths for a BIDS release, else by row id."""
    index = read_index(folder)
    if index is not None:
        return [folder / TREE / p for p in index[0]]
    return [folder / VOLUMES_DIR / n for n in volume_names(ids)]


def _bids_files(folder: Path) -> list[Path]:
    """A BIDS release's files beside its images (sidecars, description, README, participants)."""
    index = read_index(folder)
    return [] if index is None else [folder / TREE / p for p in index[1]]


def _save_volumes(folder: Path, ids: Sequence[str], output: MechanismOutput) -> None:
    """The released NIfTI files, headers stripped (what is published), written one at a time (a
    payload held by reference is read one head at a time): a BIDS dataset's into its tree, at
    their source paths with their scrubbed sidecars (synth.kinds.bids_out)."""
    from synth.kinds.nifti import write_volume

    volumes = output.payload
    if not isinstance(volumes, VolumeDataset):
        raise TypeError(f"a volume release's payload is a VolumeDataset, got {type(volumes)}")
    if volumes.layout is not None:
        release_id = ids[0].rsplit("-", 1)[0] if ids else folder.name
        write_tree(folder, volumes.layout, volumes.volumes, release_id)
        return
    (folder / VOLUMES_DIR).mkdir(exist_ok=True)
    for path, volume in zip(_volume_files(folder, ids), volumes.volumes, strict=True):
        write_volume(volume, path)


def _load_volumes(folder: Path, ids: Sequence[str]) -> VolumeDataset:
    """The released heads held by reference (each read from its file when used, one at a time:
    a release of any number of heads is never held whole)."""
    from synth.kinds.nifti import saved_file

    return VolumeDataset.by_reference(
        [saved_file(p) for p in _volume_files(folder, ids)], str(folder / VOLUMES_DIR)
    )


def _volumes_sha256(folder: Path, ids: Sequence[str]) -> str:
    return files_sha256(_volume_files(folder, ids) + _bids_files(folder), arrays_sha256(folder))


def _bundle_volumes(folder: Path, ids: Sequence[str]) -> BundleParts:
    """The NIfTI files under data/volumes/, and a column naming each row's file; a BIDS release's
    whole tree under data/bids/ (the column naming each row's image there) with the BIDS
    validator's report of it, written by the audit, as data/bids_validator.json."""
    index = read_index(folder)
    if index is None:
        files = {f"data/{VOLUMES_DIR}/{p.name}": p for p in _volume_files(folder, ids)}
        return BundleParts(columns={"file": np.array(list(files))}, files=files)
    images, others = index
    tree = {f"data/{TREE}/{p}": folder / TREE / p for p in images + others}
    report = folder / "audit" / VALIDATOR_REPORT
    if report.is_file():
        tree[f"data/{VALIDATOR_REPORT}"] = report
    return BundleParts(columns={"file": np.array([f"data/{TREE}/{p}" for p in images])}, files=tree)


def _card_volumes(parameters: Mapping[str, Any], n: int) -> list[str]:
    """A BIDS release's section: its layout, what its sidecars and participants.tsv keep, and
    how a DICOM study was converted (nothing for a flat folder)."""
    bids = parameters.get("bids")
    if not isinstance(bids, Mapping):
        return []
    lines = [
        "## The BIDS dataset",
        "",
        f"`data/{TREE}/` is a BIDS dataset (a derivative: dataset_description.json names "
        f"privrelease, the mechanism and this release): {bids.get('subjects')} subjects, "
        f"{bids.get('sessions')} subject/sessions, {bids.get('images')} images "
        f"({', '.join(bids.get('suffixes') or [])}) at their source paths. One subject is the "
        "privacy unit: all of a person's sessions and scans count once.",
        "",
        "- JSON sidecars kept (allow-list): "
        + (", ".join(bids.get("sidecar_fields_kept") or []) or "none"),
        "- sidecar fields dropped: "
        + (", ".join(bids.get("sidecar_fields_dropped") or []) or "none"),
        "- participants.tsv columns: "
        + ", ".join(["participant_id", *(bids.get("participants_columns") or [])]),
        f"- `data/{VALIDATOR_REPORT}`: the BIDS validator's report on the released tree "
        "(check `bids_valid`).",
    ]
    conversion = bids.get("conversion")
    if isinstance(conversion, Mapping):
        lines.append(
            f"- converted from DICOM by {conversion.get('tool')} {conversion.get('version')}: "
            f"series converted {conversion.get('series_converted')}, skipped "
            f"{conversion.get('series_skipped')}; series descriptions "
            f"{conversion.get('series_descriptions')}; {conversion.get('subject_labels')}. The "
            "DICOM files were never copied."
        )
    return [*lines, ""]


def _arrays_only(folder: Path, ids: Sequence[str]) -> str:
    return arrays_sha256(folder)


IMAGES = OutputKind(name="images", fingerprint=_arrays_only, audit=kind_audit("images"))
PHOTOGRAPHS = OutputKind(
    name="photographs", fingerprint=_arrays_only, audit=kind_audit("photographs")
)
VOLUMES = OutputKind(
    name="volumes",
    save=_save_volumes,
    load=_load_volumes,
    fingerprint=_volumes_sha256,
    bundle=_bundle_volumes,
    card_section=_card_volumes,
    audit_files=_volume_files,
    audit=kind_audit("volumes"),
)

BUILTIN_KINDS = (IMAGES, PHOTOGRAPHS, VOLUMES)
