"""Template heads with their face and brain marked, and the masks carried onto a subject.

Two atlases, built from the public templates by one registration of pydeface's average head to
Colin27 (public data only, so it may be cached and shared):

- the *face atlas* is pydeface's average head with its face mask and Colin27's brain carried onto
  it: what the mechanisms register to each subject (one registration gives the face to replace,
  the brain to protect and, for refacing, the replacement face);
- the *brain atlas* is Colin27 with its own brain and pydeface's face carried onto it: what the
  audit registers to each original, independently of the mechanism (another head, another
  registration), to check the brain and the face.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage

from synth.kinds.head_templates import COLIN_BRAIN, COLIN_HEAD, FACE_HEAD, FACE_MASK, head_templates
from synth.kinds.volume import Volume
from synth.tools.mri.registration import Pyramid, Registration, register_affine

CACHE_VERSION = "atlas-v1"


@dataclass
class Atlas:
    """A template head, its face and brain (bool, on its grid) and its registration pyramid."""

    name: str
    head: Volume
    face: np.ndarray
    brain: np.ndarray
    _pyramid: Pyramid | None = field(default=None, repr=False)
    _images: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def pyramid(self) -> Pyramid:
        if self._pyramid is None:
            self._pyramid = Pyramid(self.head)
        return self._pyramid

    def register(self, subject: Volume) -> Registration:
        return register_affine(self.pyramid, subject)

    def image(self, what: str):
        """The head, face or brain as a SimpleITK image, converted once (a 1 mm template is ten
        million voxels: converting it for every subject would cost more than registering)."""
        from synth.tools.mri.registration import to_sitk

        if what not in self._images:
            values = {"head": None, "face": self.face, "brain": self.brain}[what]
            self._images[what] = to_sitk(
                self.head, None if values is None else values.astype(np.float32)
            )
        return self._images[what]

    def on(self, subject: Volume, reg: Registration) -> SubjectMasks:
        """This atlas's face and brain carried onto `subject` through `reg`."""
        return SubjectMasks(
            face=reg.resample_mask(self.image("face"), None, subject),
            brain=reg.resample_mask(self.image("brain"), None, subject),
        )

    def head_on(self, subject: Volume, reg: Registration) -> np.ndarray:
        """This atlas's head intensities on `subject`'s grid."""
        return reg.resample(self.image("head"), subject)


@dataclass(frozen=True)
class SubjectMasks:
    face: np.ndarray  # bool, on the subject's grid
    brain: np.ndarray


def grow(
    mask: np.ndarray, zooms: tuple[float, float, float], mm: float, near: np.ndarray | None = None
) -> np.ndarray:
    """`mask` grown by `mm` millimetres (Euclidean). With `near`, computed only in the box of
    `near` widened by `mm` (exact there; `mask` as it is elsewhere): around a face, a dilation of
    the whole head would cost seconds for nothing."""
    out = mask.copy()
    if mm <= 0 or not mask.any():
        return out
    region = mask if near is None else near
    if not region.any():
        return out
    idx = np.argwhere(region)
    pad = np.ceil(mm / np.asarray(zooms)).astype(int) + 1
    lo = np.maximum(idx.min(0) - pad, 0)
    hi = np.minimum(idx.max(0) + pad + 1, mask.shape)
    box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
    dist = ndimage.distance_transform_edt(~mask[box], sampling=zooms)
    out[box] |= dist <= mm
    return out


def _templates_key() -> str:
    return hashlib.sha256((CACHE_VERSION + head_templates().content_sha256()).encode()).hexdigest()[
        :24
    ]


def _build() -> tuple[Atlas, Atlas]:
    t = head_templates()
    face_head, colin = t.named(FACE_HEAD), t.named(COLIN_HEAD)
    face, brain = t.named(FACE_MASK).data > 0, t.named(COLIN_BRAIN).data > 0
    face_atlas_pyr = Pyramid(face_head)
    # pydeface head -> Colin27: maps Colin27 points to pydeface-head points
    reg = register_affine(face_atlas_pyr, colin)
    face_on_colin = reg.resample_mask(face_head, face, colin)
    inverse = Registration(reg.transform.GetInverse(), reg.metric)
    brain_on_face = inverse.resample_mask(colin, brain, face_head)
    return (
        Atlas("pydeface average head", face_head, face, brain_on_face, face_atlas_pyr),
        Atlas("Colin27", colin, face_on_colin, brain),
    )


@lru_cache(maxsize=4)
def atlases(cache_dir: Path | None = None) -> tuple[Atlas, Atlas]:
    """(face atlas, brain atlas); with `cache_dir`, the carried masks are kept there (public data
    only, keyed on the templates' content hash) so later processes skip the registration."""
    t = head_templates()
    path = Path(cache_dir) / f"head-atlas-{_templates_key()}.npz" if cache_dir else None
    if path is not None and path.is_file():
        with np.load(path) as z:
            return (
                Atlas("pydeface average head", t.named(FACE_HEAD), z["face_face"], z["face_brain"]),
                Atlas("Colin27", t.named(COLIN_HEAD), z["colin_face"], z["colin_brain"]),
            )
    face_atlas, brain_atlas = _build()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")  # concurrent writers
        np.savez_compressed(
            tmp,
            face_face=face_atlas.face,
            face_brain=face_atlas.brain,
            colin_face=brain_atlas.face,
            colin_brain=brain_atlas.brain,
        )
        tmp.replace(path)
    return face_atlas, brain_atlas
