"""The face attacks' [policy] keys (audit/face_reid.py, the plan check of audit/held_out.py): the
section the image and photograph kinds declare (audit/kinds/builtin.py). Users write them in the
flat [policy] table beside the core keys (audit/policy.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from accounting.errors import InvalidParameterError
from audit.policy import check_flag, check_number

FACE_MODES = ("auto", "on", "off")
_SHARES = {
    "face_max_verification_rate",
    "face_max_rank1_rate",
    "face_min_detection_retention",
}
_COUNTS = {"face_samples", "face_probe"}


@dataclass(frozen=True)
class FacePolicy:
    # face re-identification (audit/face_reid.py): "auto" runs it on every empirical
    # de-identification release and on any other release whose sensitive set holds faces (images
    # of at least 32 px, the detector finding one in at least half of `face_probe` of them); "on"
    # always, "off" never
    face_reidentification: str = "auto"
    # the recognisers that attack every face release, each with its own detection and alignment
    # (synth.tools.face_recognisers.RECOGNISERS); a mechanism that searched against some of them is
    # judged by the others too
    face_recognisers: tuple[str, ...] = ("dlib", "sface", "facenet")
    # share of released faces a recogniser still verifies as their original (TAR at its own
    # threshold; for synthetic releases: matches with training faces above the held-out rate)
    face_max_verification_rate: float | None = 0.05
    # rank-1 identification above chance (one-sided binomial test) at this level fails; 0: never
    face_rank1_alpha: float | None = 0.05
    face_max_rank1_rate: float | None = None  # rank-1 ceiling; informational by default
    # realism of replaced faces (paired releases whose faces stay in place: face-deid): the share
    # YuNet still finds (confidence >= 0.8, IoU >= 0.5), the mean displacement of YuNet's 5
    # landmarks (inter-ocular distances), and whether their KID is below blurred faces'
    face_min_detection_retention: float | None = 0.99
    face_max_landmark_shift: float | None = 0.05
    # the same for faces drawn in k-Same-M's `strict` geometry, whose eyes, nose and mouth take the
    # average's places by design (the shape is part of who a face is)
    face_max_landmark_shift_strict: float | None = 0.08
    face_max_kid_vs_blur: bool = True
    face_samples: int = 200  # released images attacked, and original photos in the gallery
    face_probe: int = 16  # sensitive images the "auto" rule looks at
    # an embedder of synth.tools.face_models.EMBEDDERS other than dlib (older specs) attacks as well
    face_embedder: str = "dlib"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "face_max_kid_vs_blur":
                check_flag(f.name, value)
            elif f.name == "face_reidentification":
                _check_mode(value)
            elif f.name == "face_recognisers":
                object.__setattr__(self, f.name, _recogniser_keys(value))
            elif f.name == "face_embedder":
                if not isinstance(value, str) or not value:
                    raise InvalidParameterError(
                        f"audit policy face_embedder must name an embedder, got {value!r}."
                    )
            elif value is not None:
                check_number(f.name, value, share=f.name in _SHARES, count=f.name in _COUNTS)
                _check_bounds(f.name, value)


def _check_mode(value: Any) -> None:
    if value not in FACE_MODES:
        raise InvalidParameterError(
            f"audit policy face_reidentification must be one of {', '.join(FACE_MODES)}"
            f", got {value!r}."
        )


def _check_bounds(name: str, value: float) -> None:
    """The bounds particular to one numeric face key."""
    if name.startswith("face_max_landmark_shift") and value < 0:
        raise InvalidParameterError(f"audit policy {name} must be >= 0, got {value}.")
    if name == "face_rank1_alpha" and not 0 <= value < 1:
        raise InvalidParameterError(
            f"audit policy face_rank1_alpha must be at least 0 and below 1 (0 makes rank-1 "
            f"informational: no p-value is below 0), got {value}."
        )


def _recogniser_keys(value: Any) -> tuple[str, ...]:
    """The policy's face_recognisers as a tuple of known keys (TOML gives a list)."""
    from synth.tools.face_recognisers import RECOGNISERS

    known = ", ".join(sorted(RECOGNISERS))
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise InvalidParameterError(
            f"audit policy face_recognisers must be a non-empty list of recognisers ({known}), "
            f"got {value!r}."
        )
    unknown = [k for k in value if k not in RECOGNISERS]
    if unknown:
        raise InvalidParameterError(
            f"audit policy face_recognisers names unknown recogniser(s) {unknown}; known: {known}."
        )
    return tuple(dict.fromkeys(value))
