"""The built-in input kinds: head volumes (a folder of NIfTI files, a BIDS dataset, a DICOM
study, or the public head templates), then images (everything else: built-ins, photo folders,
class folders, Parquet, NumPy). The only module of the input kinds that names one."""

from __future__ import annotations

from typing import Any

from accounting.errors import DataFormatError
from accounting.fingerprint import dataset_fingerprint, volume_digests_fingerprint
from synth.kinds.datasets import is_volume_source, load_data, load_source
from synth.kinds.image_dataset import ImageDataset
from synth.kinds.inputs import InputKind
from synth.kinds.label_declaration import LabelDeclaration, declared_labels
from synth.kinds.volume import VolumeDataset


def _no_labels(source: str, data: Any, declaration: LabelDeclaration) -> list[int]:
    if declaration is not None and not (isinstance(declaration, str) and not declaration.strip()):
        raise DataFormatError(f"{source}: head volumes carry no class labels; leave out --labels.")
    return []


def _volumes_fingerprint(key: bytes, data: VolumeDataset) -> str:
    """Every volume's stored voxels, affine and scaling: from the digests taken as each file was
    read, so that a folder held by reference is not read again; a BIDS dataset's layout (paths,
    scrubbed sidecars, allowed participants columns: released too) with them."""
    extra = [data.layout.digest()] if data.layout is not None else []
    return volume_digests_fingerprint(key, data.record_digests() + extra)


def _volumes_unit(data: VolumeDataset) -> str:
    if data.layout is not None:
        return "one subject (all of a person's sessions and scans)"
    return "one head scan"


def _images_fingerprint(key: bytes, data: ImageDataset) -> str:
    return dataset_fingerprint(key, data.images, data.labels)


VOLUMES = InputKind(
    name="volumes",
    what="head volumes (a folder of NIfTI files)",
    recognises=is_volume_source,
    load=load_data,
    holds=lambda data: isinstance(data, VolumeDataset),
    declare=_no_labels,
    fingerprint=_volumes_fingerprint,
    as_registered=lambda data, labels: data,
    labelled=False,
    privacy_unit="one head scan",
    unit_of=_volumes_unit,
    keyed=lambda data, key: data.with_key(key),
)
IMAGES = InputKind(
    name="images",
    what="images",
    recognises=lambda source: not is_volume_source(source),
    load=load_source,
    holds=lambda data: isinstance(data, ImageDataset),
    declare=declared_labels,
    fingerprint=_images_fingerprint,
    as_registered=lambda data, labels: data.with_declared(labels),
    labelled=True,
    privacy_unit="one image",
)
BUILTIN_INPUT_KINDS = (VOLUMES, IMAGES)
