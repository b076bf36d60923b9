"""A release's files in the workspace (`artifacts/REL/`): the output saved once after the run
(release.npz: images, labels, label distributions, extra image columns; internal.json: what was
derived from sensitive data, for the audit, stewards and auditors only; a volume release's NIfTI
files), read back typed; the row ids and file names a release gives its records; the content hash
of public data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from accounting.errors import LedgerStateError
from accounting.events import event_to_json
from accounting.store import Store
from release import runner
from release.records import RunRecord, get_release
from synth.kinds.datasets import ImageDataset
from synth.kinds.volume import VolumeDataset
from synth.registry import MechanismOutput

EXTRA_IMAGE = "extra_image__"  # release.npz key prefix of MechanismOutput.extra_images
VOLUMES_DIR = "volumes"  # a volume release's NIfTI files, in artifacts/REL/ and in the bundle


def release_dir(store: Store, release_id: str) -> Path:
    return store.workspace.artifacts / release_id


def release_ids(release_id: str, n: int) -> list[str]:
    return [f"{release_id}-{i:06d}" for i in range(n)]


def volume_names(release_id: str, n: int) -> list[str]:
    """The released NIfTI files' names: the row ids (the source file names can identify people
    and are never released)."""
    return [f"{i}.nii.gz" for i in release_ids(release_id, n)]


def public_sha256(public: ImageDataset | VolumeDataset) -> str:
    """Content hash of PUBLIC data (a plain hash is fine here: nothing sensitive)."""
    if isinstance(public, VolumeDataset):
        return public.content_sha256()
    h = hashlib.sha256()
    for arr in (np.ascontiguousarray(public.images), np.ascontiguousarray(public.labels)):
        h.update(str((arr.dtype.str, arr.shape)).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def save_output(
    store: Store, release_id: str, result: runner.RunResult, mechanism: str
) -> RunRecord:
    """One copy of the output: release.npz (images, labels) + internal.json (sensitive-derived,
    internal)."""
    from audit.report import jsonable

    out, o = release_dir(store, release_id), result.output
    out.mkdir(parents=True, exist_ok=True)
    if o.volumes is not None:  # the released NIfTI files, headers stripped (what is published)
        from synth.kinds.nifti import write_volume

        folder = out / VOLUMES_DIR
        folder.mkdir(exist_ok=True)
        for name, volume in zip(
            volume_names(release_id, len(o.volumes)), o.volumes.volumes, strict=True
        ):
            write_volume(volume, folder / name)
    arrays: dict[str, Any] = {"images": o.images, "labels": o.labels}
    if o.label_distributions is not None:
        arrays["label_distributions"] = o.label_distributions
    for name, extra in o.extra_images.items():
        arrays[EXTRA_IMAGE + name] = extra
    np.savez_compressed(out / "release.npz", **arrays)
    internal = {
        **o.internal,
        "clusters": None if o.clusters is None else [c.tolist() for c in o.clusters],
        "selected_public_indices": None
        if o.selected_public_indices is None
        else o.selected_public_indices.tolist(),
        "withheld": {str(i): why for i, why in o.withheld.items()},
    }
    (out / "internal.json").write_text(json.dumps(jsonable(internal)))
    summary = {
        "mechanism": mechanism,
        "guarantee": result.guarantee.as_dict(),
        "parameters": dict(o.parameters),
        "executed_events": [event_to_json(e) for e in result.executed_events],
        "generator": o.generator,
        "artifacts": dict(o.artifacts),
        "count": int(len(o.images)),
        "charge_id": result.charge_id,
    }
    return RunRecord.from_json(jsonable(summary))


def load_release_data(
    store: Store, release_id: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    with np.load(release_dir(store, release_id) / "release.npz") as z:
        return (
            z["images"],
            z["labels"],
            (z["label_distributions"] if "label_distributions" in z else None),
        )


def load_extra_images(store: Store, release_id: str) -> dict[str, np.ndarray]:
    """The release's extra image columns (MechanismOutput.extra_images), by name."""
    with np.load(release_dir(store, release_id) / "release.npz") as z:
        return {k[len(EXTRA_IMAGE) :]: z[k] for k in z.files if k.startswith(EXTRA_IMAGE)}


def load_output(store: Store, release_id: str) -> MechanismOutput:
    """A synthesised release's output, typed (internal fields included: stewards and auditors
    only)."""
    rel = get_release(store, release_id)
    if rel.result is None:
        raise LedgerStateError(f"Release {release_id} has not been synthesised yet; run it first.")
    images, labels, dist = load_release_data(store, release_id)
    path = release_dir(store, release_id) / "internal.json"
    internal = json.loads(path.read_text()) if path.exists() else {}
    clusters, selected = (
        internal.pop("clusters", None),
        internal.pop("selected_public_indices", None),
    )
    withheld = {int(i): str(why) for i, why in (internal.pop("withheld", None) or {}).items()}
    res = rel.result
    folder = release_dir(store, release_id) / VOLUMES_DIR
    volumes = None
    if folder.is_dir():
        from synth.kinds.nifti import read_volume

        volumes = VolumeDataset(
            [read_volume(folder / n, n) for n in volume_names(release_id, len(images))],
            str(folder),
        )
    return MechanismOutput(
        volumes=volumes,
        images=images,
        labels=labels,
        parameters=res.parameters,
        label_distributions=dist,
        clusters=None
        if clusters is None
        else tuple(np.asarray(c, dtype=np.int64) for c in clusters),
        selected_public_indices=None if selected is None else np.asarray(selected, dtype=np.int64),
        internal=internal,
        generator=res.generator,
        artifacts=res.artifacts,
        extra_images=load_extra_images(store, release_id),
        withheld=withheld,
    )
