"""Replacement faces for refacing: a plugin point.

A face model gets what a refacer may see of one subject, never its face: the subject *defaced*
(the voxels to replace set to background, physical intensities), the region to fill, and the
template's face registered to the subject and intensity-matched (a suggestion it may ignore). It
returns physical intensities on the subject's grid; only the region's voxels are used, so a model
cannot change the brain or anything else outside the face.

"template" (built in) returns the template's face as it is: the approach of mri_reface. A model
trained elsewhere, e.g. the 3D conditional GAN of the MRI-refacing literature, plugs in as a Python
package declaring an entry point in the group `privrelease.faces`:

    [project.entry-points."privrelease.faces"]
    cgan = "mypackage.refacer:make_face_model"   # () -> FaceModel

and a spec then says `face = "cgan"` in its [reface] table (docs/volumes.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol

import numpy as np

from accounting.errors import InvalidParameterError

GROUP = "privrelease.faces"


@dataclass(frozen=True)
class FaceRequest:
    defaced: np.ndarray  # float32 (X, Y, Z): the subject with `region` at background
    region: np.ndarray  # bool (X, Y, Z): the voxels the model fills
    template_face: np.ndarray  # float32 (X, Y, Z): the template registered and intensity-matched
    zooms: tuple[float, float, float]  # voxel sizes, mm
    affine: np.ndarray  # (4, 4) voxel -> world (RAS), e.g. to find "anterior"


class FaceModel(Protocol):
    def __call__(self, request: FaceRequest) -> np.ndarray: ...


def template_face(request: FaceRequest) -> np.ndarray:
    """The built-in model: the registered, intensity-matched template face."""
    return request.template_face


BUILTIN: dict[str, Callable[[], FaceModel]] = {"template": lambda: template_face}


def available() -> list[str]:
    return sorted(set(BUILTIN) | {ep.name for ep in entry_points(group=GROUP)})


def load(name: str) -> FaceModel:
    """The face model `name`: built in, or an installed package's `privrelease.faces` entry
    point."""
    if name in BUILTIN:
        return BUILTIN[name]()
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise InvalidParameterError(
            f"[reface] face {name!r} is not installed; available: {', '.join(available())}. A "
            f"face model is a package declaring an entry point in the group {GROUP!r}."
        )
    return found[0].load()()


def fill(model: FaceModel, request: FaceRequest) -> np.ndarray:
    """Run `model` and check what it returns (the region's values, finite, on the grid)."""
    out = np.asarray(model(request), dtype=np.float32)
    if out.shape != request.region.shape:
        raise InvalidParameterError(
            f"The face model returned an array of shape {out.shape}; it must return the "
            f"subject's grid {request.region.shape}."
        )
    if not np.isfinite(out[request.region]).all():
        raise InvalidParameterError("The face model returned NaN or infinite intensities.")
    return out
