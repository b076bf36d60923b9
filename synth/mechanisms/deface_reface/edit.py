"""What the volume mechanisms do to one subject: register the face atlas, then cut or replace the
face, never touching a voxel within the margin around the registered brain.

Every output is a copy of the subject's stored array in which only the chosen region's voxels are
written: voxels outside it, the brain among them, are the subject's own bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accounting.errors import DataFormatError
from synth.kinds.volume import Volume
from synth.mechanisms.deface_reface import replacement_faces as faces
from synth.tools.mri.atlas import Atlas, grow
from synth.tools.mri.registration import check_fit

MATCH_RING_MM = 12.0  # intensity matching looks at the head this far around the face
QUANTILES = np.linspace(0.01, 0.99, 99)


@dataclass(frozen=True)
class Edited:
    volume: Volume
    stats: dict[str, Any] = field(default_factory=dict)  # internal: computed from the subject


def _setup(subject: Volume, atlas: Atlas, margin_mm: float):
    started = time.perf_counter()
    reg = atlas.register(subject)
    # registration admitted the dataset with the same deterministic fit; this guards a template or
    # code change since: never cut a face where a turned or failed fit puts it
    check_fit(reg, subject.name or "volume")
    masks = atlas.on(subject, reg)
    keep = grow(masks.brain, subject.zooms, margin_mm, near=masks.face)
    stats = {
        "registration_metric": round(reg.metric, 4),
        "seconds_registration": round(time.perf_counter() - started, 2),
        "brain_voxels": int(masks.brain.sum()),
        "face_voxels": int(masks.face.sum()),
    }
    return reg, masks, keep, stats


def little_endian(volume: Volume) -> Volume:
    """`volume` with its voxels in little-endian byte order (the same values): what a released file
    holds whatever the input's order, as NIfTI consumers expect (nibabel writes it so anyway)."""
    dtype = volume.data.dtype
    if dtype.newbyteorder("<") == dtype:
        return volume
    data = volume.data.astype(dtype.newbyteorder("<"))
    return Volume(data, volume.affine, volume.slope, volume.inter, volume.name)


def _written(subject: Volume, region: np.ndarray, values: np.ndarray, stats: dict) -> Edited:
    out = subject.data.copy()
    out[region] = subject.to_stored(values)
    stats["changed_voxels"] = int((out != subject.data).sum())
    stats["region_voxels"] = int(region.sum())
    return Edited(little_endian(subject.with_data(out)), stats)


def quickshear_keep(brain: np.ndarray, affine: np.ndarray, buffer: int) -> np.ndarray:
    """The voxels quickshear keeps (above its cutting plane), from the published implementation
    (the `quickshear` package) run on a 0/1 image so that the subject's voxels never pass through
    its float arithmetic."""
    import nibabel as nib
    from quickshear import quickshear

    ones = nib.Nifti1Image(np.ones(brain.shape, np.uint8), affine)
    mask = nib.Nifti1Image(brain.astype(np.uint8), affine)
    return np.asanyarray(quickshear(ones, mask, buffer).dataobj).astype(bool)


def deface(subject: Volume, atlas: Atlas, method: str, margin_mm: float, buffer: int) -> Edited:
    """The face set to background: below quickshear's plane, or inside the registered face mask."""
    reg, masks, keep, stats = _setup(subject, atlas, margin_mm)
    if method == "quickshear":
        if masks.brain.sum() < 2:  # admitted datasets never get here; quickshear would crash
            raise DataFormatError(
                f"{subject.name or 'volume'}: the registered brain is empty on this grid; "
                "quickshear cannot place its plane. Register finer scans."
            )
        cut = ~quickshear_keep(masks.brain, subject.affine, buffer)
        keep = grow(masks.brain, subject.zooms, margin_mm, near=cut)
    else:
        cut = masks.face
    region = cut & ~keep
    return _written(subject, region, np.zeros(int(region.sum()), np.float32), stats)


def _matched(template: np.ndarray, subject: np.ndarray, ring: np.ndarray) -> np.ndarray:
    """The template's intensities mapped onto the subject's by matching their quantiles over the
    head around the face (same anatomy in both after registration)."""
    if ring.sum() < 100:
        return template
    src, dst = np.quantile(template[ring], QUANTILES), np.quantile(subject[ring], QUANTILES)
    src = np.maximum.accumulate(src + np.arange(len(src)) * 1e-6)  # strictly increasing for interp
    return np.interp(template, src, dst).astype(np.float32)


def reface(subject: Volume, atlas: Atlas, margin_mm: float, model: faces.FaceModel) -> Edited:
    """The face replaced by `model`'s (by default the atlas head's face, registered to the subject
    and intensity-matched)."""
    reg, masks, keep, stats = _setup(subject, atlas, margin_mm)
    region = masks.face & ~keep
    values = subject.physical()
    template = atlas.head_on(subject, reg)
    ring = grow(masks.face, subject.zooms, MATCH_RING_MM, near=masks.face) & ~masks.face
    matched = _matched(template, values, ring & ~keep)
    defaced = values.copy()
    defaced[region] = 0.0
    request = faces.FaceRequest(defaced, region, matched, subject.zooms, subject.affine)
    face = faces.fill(model, request)
    return _written(subject, region, face[region], stats)
