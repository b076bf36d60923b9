"""Run parameters of the volume mechanisms, validated when the spec is planned."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from numbers import Integral, Real
from typing import Any

from accounting.errors import InvalidParameterError

DEFACE_METHODS = ("quickshear", "mask")
MAX_MARGIN_MM = 30.0


def _margin(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise InvalidParameterError(f"brain_margin_mm must be a finite number, got {value!r}.")
    if not 0 <= float(value) <= MAX_MARGIN_MM:
        raise InvalidParameterError(
            f"brain_margin_mm must be between 0 and {MAX_MARGIN_MM:g} mm (the face lies within "
            f"a few centimetres of the brain), got {float(value):g}."
        )
    return float(value)


@dataclass(frozen=True)
class DefaceConfig:
    """method: "quickshear" (Schimke & Hale 2011: cut below the plane under the brain's lower
    front edge) or "mask" (pydeface's face mask, registered to each subject with an affine
    transform, set to background). brain_margin_mm: voxels this close to the registered brain are
    never changed, whatever the method. quickshear_buffer: voxels between the brain and the
    cutting plane (quickshear's own default, 10)."""

    method: str = "quickshear"
    brain_margin_mm: float = 5.0
    quickshear_buffer: int = 10

    def __post_init__(self) -> None:
        if self.method not in DEFACE_METHODS:
            raise InvalidParameterError(
                f"[deface] method must be one of {DEFACE_METHODS}, got {self.method!r}."
            )
        object.__setattr__(self, "brain_margin_mm", _margin(self.brain_margin_mm))
        b = self.quickshear_buffer
        if isinstance(b, bool) or not isinstance(b, Integral) or not 0 <= int(b) <= 100:
            raise InvalidParameterError(
                f"quickshear_buffer must be an integer number of voxels in 0..100, got {b!r}."
            )

    @classmethod
    def demo(cls, **kw: Any) -> DefaceConfig:
        return cls(**kw)

    tiny = demo

    def public_parameters(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RefaceConfig:
    """face: the replacement face, a plugin name
    (`synth.mechanisms.deface_reface.replacement_faces`; "template" = pydeface's
    average face, registered to the subject and intensity-matched). brain_margin_mm: as for
    deface."""

    face: str = "template"
    brain_margin_mm: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.face, str) or not self.face:
            raise InvalidParameterError(f"[reface] face must be a plugin name, got {self.face!r}.")
        object.__setattr__(self, "brain_margin_mm", _margin(self.brain_margin_mm))

    @classmethod
    def demo(cls, **kw: Any) -> RefaceConfig:
        return cls(**kw)

    tiny = demo

    def public_parameters(self) -> dict[str, Any]:
        return asdict(self)
