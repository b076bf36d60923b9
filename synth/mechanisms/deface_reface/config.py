"""Run parameters of the volume mechanisms: frozen configs (synth.config), checked when the spec is
planned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from accounting.errors import InvalidParameterError
from synth import config as check
from synth.config import MechanismConfig

DEFACE_METHODS = ("quickshear", "mask")
MAX_MARGIN_MM = 30.0
# the demo and the tests run the defaults: a head takes seconds either way
SAME_AS_DEFAULT: Mapping[str, Mapping[str, Any]] = {"demo": {}, "tiny": {}}


def _margin(value: object) -> float:
    return check.number(
        "brain_margin_mm",
        value,
        0.0,
        MAX_MARGIN_MM,
        hint="mm; the face lies within a few centimetres of the brain",
    )


@dataclass(frozen=True)
class DefaceConfig(MechanismConfig):
    """method: "quickshear" (Schimke & Hale 2011: cut below the plane under the brain's lower
    front edge) or "mask" (pydeface's face mask, registered to each subject with an affine
    transform, set to background). brain_margin_mm: voxels this close to the registered brain are
    never changed, whatever the method. quickshear_buffer: voxels between the brain and the
    cutting plane (quickshear's own default, 10)."""

    method: str = "quickshear"
    brain_margin_mm: float = 5.0
    quickshear_buffer: int = 10

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = SAME_AS_DEFAULT

    @classmethod
    def checked(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **v,
            "method": check.choice("method", v["method"], DEFACE_METHODS),
            "brain_margin_mm": _margin(v["brain_margin_mm"]),
            "quickshear_buffer": check.whole(
                "quickshear_buffer", v["quickshear_buffer"], 0, 100, hint="voxels"
            ),
        }


@dataclass(frozen=True)
class RefaceConfig(MechanismConfig):
    """face: the replacement face, a plugin name
    (`synth.mechanisms.deface_reface.replacement_faces`; "template" = pydeface's
    average face, registered to the subject and intensity-matched). brain_margin_mm: as for
    deface."""

    face: str = "template"
    brain_margin_mm: float = 5.0

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = SAME_AS_DEFAULT

    @classmethod
    def checked(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(v["face"], str) or not v["face"]:
            raise InvalidParameterError(f"face must be a plugin name, got {v['face']!r}.")
        return {**v, "brain_margin_mm": _margin(v["brain_margin_mm"])}
