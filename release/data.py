"""Registering datasets from their source, and loading a registered dataset back safely.

The label set is declared at registration (public metadata), never read off the data: the data's
labels must be a subset of the declaration, and everything downstream (the classes a mechanism
generates, the released label set) uses the declaration, so a class held by one record is not
revealed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from accounting import ledger
from accounting.errors import DataFormatError, DatasetConflictError
from accounting.fingerprint import dataset_fingerprint, volume_digests_fingerprint
from accounting.store import Store
from synth.kinds.datasets import BUILTINS, MAX_LABEL, ImageDataset, is_volume_source, load_data
from synth.kinds.photos import FLAT_CLASS, is_photos
from synth.kinds.volume import VolumeDataset

LabelDeclaration = str | Sequence[int] | Sequence[str] | None
DECLARE_HELP = (
    "Declare the label set with --labels: label values such as `0-9` or `0,1,2,5` for .npz/Parquet "
    "data, the class subfolder names (e.g. `cat,dog`) for a folder. List every class the data may "
    "hold, including classes with no images."
)


def _parse_values(text: str) -> list[int]:
    """`0-9`, `0,1,2,5`, `0-4,7`: label values, each in 0..MAX_LABEL (checked before any range is
    built)."""
    values: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise DataFormatError(
                f"--labels: {part!r} is not a label value or range. {DECLARE_HELP}"
            ) from None
        if not 0 <= a <= b <= MAX_LABEL:
            raise DataFormatError(
                f"--labels: {part!r} is not within 0..{MAX_LABEL} (low to high). {DECLARE_HELP}"
            )
        values.update(range(a, b + 1))
    return sorted(values)


def _folder_labels(data: ImageDataset, names: list[str]) -> list[int]:
    """A folder's classes are its subfolders (labels by sorted name); the declared names must be
    exactly those, an empty subfolder standing for a declared class without images."""
    missing, extra = (
        sorted(set(names) - set(data.class_names)),
        sorted(set(data.class_names) - set(names)),
    )
    if missing or extra:
        raise DataFormatError(
            f"{data.source}: the declared classes must be the class subfolders. "
            + (
                f"No subfolder for {missing}: create an empty one for a class without images. "
                if missing
                else ""
            )
            + (
                f"Subfolders {extra} are not declared: add them to --labels or move them out. "
                if extra
                else ""
            )
        )
    return list(range(len(data.class_names)))


def declared_labels(source: str, data: ImageDataset, declaration: LabelDeclaration) -> list[int]:
    """The label set to register: the declaration (a built-in's own when none is given), checked to
    cover every label in the data."""
    photo_folder = is_photos(source)
    if declaration is None or (isinstance(declaration, str) and not declaration.strip()):
        if source in BUILTINS:
            return list(data.label_set)
        if photo_folder and data.class_names == [FLAT_CLASS]:  # one flat folder: one class
            return [0]
        raise DataFormatError(f"{source}: no label set was declared. {DECLARE_HELP}")
    items = (
        [s.strip() for s in declaration.split(",")]
        if isinstance(declaration, str)
        else list(declaration)
    )
    is_folder = photo_folder or (not source.startswith("builtin:") and Path(source).is_dir())
    if is_folder:
        labels = _folder_labels(data, [str(s) for s in items])
    elif isinstance(declaration, str):
        labels = _parse_values(declaration)
    else:
        labels = _parse_values(
            ",".join(str(int(v)) if isinstance(v, (int, np.integer)) else str(v) for v in items)
        )
    data.with_declared(labels)  # refuses labels in the data outside the declaration
    return labels


def register_from_source(
    store: Store,
    name: str,
    source: str,
    epsilon_cap: float,
    delta_cap: float,
    *,
    labels: LabelDeclaration = None,
    privacy_unit: str = "one image",
    actor: str = "steward",
) -> tuple[ledger.Dataset, bool]:
    """Load the data once to check and fingerprint it (HMAC, rule 4) and register it with its
    declared label set; the data stays where it is. Any problem raises before the store is
    touched. A folder of NIfTI head volumes registers as a volume dataset (`data_kind`)."""
    data = load_data(source)
    if isinstance(data, VolumeDataset):
        if labels is not None and not (isinstance(labels, str) and not labels.strip()):
            raise DataFormatError(
                f"{source}: head volumes carry no class labels; leave out --labels."
            )
        # orientation, registration fit, masks and memory: what would otherwise fail (or be
        # released wrong) only after a release had read the data and been charged
        from synth.mechanisms.deface_reface.admission import check_heads

        check_heads(data, _public_cache(store))
        label_set: list[int] = []
        if privacy_unit == "one image":  # the CLI's default, worded for a scan
            privacy_unit = "one head scan"
    else:
        label_set = declared_labels(source, data, labels)
    return ledger.register_dataset(
        store,
        name=name,
        source=source,
        fingerprint=fingerprint(store, data),
        record_count=len(data),
        labels=label_set,
        image_shape=list(data.image_shape),
        epsilon_cap=epsilon_cap,
        delta_cap=delta_cap,
        privacy_unit=privacy_unit,
        actor=actor,
    )


def _public_cache(store: Store) -> Path:
    """The workspace's cache of public computations (release.runner.public_cache_dir's rule)."""
    env = os.environ.get("PRIVRELEASE_CACHE")
    return Path(env) if env else store.workspace.root / "cache"


def fingerprint(store: Store, data: ImageDataset | VolumeDataset) -> str:
    """The dataset's HMAC-SHA256 under the workspace key (images and labels, or every volume's
    stored voxels, affine and scaling: from the digests taken as each file was read, so that a
    folder held by reference is not read again)."""
    key = store.workspace.hmac_key()
    if isinstance(data, VolumeDataset):
        return volume_digests_fingerprint(key, data.record_digests())
    return dataset_fingerprint(key, data.images, data.labels)


def data_kind(ds: ledger.Dataset) -> str:
    """ "volumes" or "images" (synth.registry.DATA_KINDS). A volume dataset is registered with no
    label set; an image dataset always declares at least one label."""
    return "images" if ds.labels else "volumes"


def load_registered(store: Store, name: str) -> tuple[ledger.Dataset, ImageDataset | VolumeDataset]:
    """Load a registered dataset and check it is the content that was registered (the ledger is
    about that content; silently changed data would make its accounting meaningless). The returned
    data carries the registered label set, which is what mechanisms generate and release."""
    ds = ledger.get_dataset(store, name)
    if data_kind(ds) == "volumes":
        if not is_volume_source(ds.source):
            raise DatasetConflictError(
                f"{ds.source}: dataset {ds.name!r} was registered as a folder of NIfTI volumes, "
                "which is no longer there. Restore the folder."
            )
        volumes = load_data(ds.source)
        if fingerprint(store, volumes) != ds.fingerprint:
            raise DatasetConflictError(
                f"The volumes at {ds.source} have changed since dataset {ds.name!r} was "
                "registered. Restore the original files, or register the new content under a new "
                "name (its budget starts fresh)."
            )
        return ds, volumes
    data = load_data(ds.source)
    if not isinstance(data, ImageDataset):
        raise DatasetConflictError(
            f"{ds.source}: dataset {ds.name!r} was registered as images but the source now holds "
            "NIfTI volumes. Restore the original data."
        )
    if fingerprint(store, data) != ds.fingerprint:
        raise DatasetConflictError(
            f"The data at {ds.source} has changed since dataset {ds.name!r} "
            "was registered. Restore the original data, or register the "
            "new content under a new name (its budget starts fresh)."
        )
    return ds, data.with_declared(list(ds.labels))
