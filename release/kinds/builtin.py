"""The built-in output kinds (release.kinds): 2D images (PrivImage, DP-MERF, k-SALSA),
photographs (face-deid's de-identified photos, with their aligned faces as an extra image
column) and head volumes (deface, reface: one NIfTI file per released row, headers stripped).
The one place in release/ that names them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from audit.kinds import kind_audit
from release.kinds import BundleParts, OutputKind, arrays_sha256, files_sha256
from synth.kinds.volume import VolumeDataset
from synth.registry import MechanismOutput

VOLUMES_DIR = "volumes"  # a volume release's NIfTI files, in artifacts/REL/ and in the bundle


def volume_names(ids: Sequence[str]) -> list[str]:
    """The released NIfTI files' names: the row ids (the source file names can identify people
    and are never released)."""
    return [f"{i}.nii.gz" for i in ids]


def _volume_files(folder: Path, ids: Sequence[str]) -> list[Path]:
    return [folder / VOLUMES_DIR / n for n in volume_names(ids)]


def _save_volumes(folder: Path, ids: Sequence[str], output: MechanismOutput) -> None:
    """The released NIfTI files, headers stripped (what is published), written one at a time (a
    payload held by reference is read one head at a time)."""
    from synth.kinds.nifti import write_volume

    volumes = output.payload
    if not isinstance(volumes, VolumeDataset):
        raise TypeError(f"a volume release's payload is a VolumeDataset, got {type(volumes)}")
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
    return files_sha256(_volume_files(folder, ids), arrays_sha256(folder))


def _bundle_volumes(folder: Path, ids: Sequence[str]) -> BundleParts:
    """The NIfTI files under data/volumes/, and a column naming each row's file."""
    files = {f"data/{VOLUMES_DIR}/{p.name}": p for p in _volume_files(folder, ids)}
    return BundleParts(columns={"file": np.array(list(files))}, files=files)


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
    audit_files=_volume_files,
    audit=kind_audit("volumes"),
)

BUILTIN_KINDS = (IMAGES, PHOTOGRAPHS, VOLUMES)
