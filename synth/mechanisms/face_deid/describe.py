"""What a face de-identification release is, in the words of its dataset card (no torch: read at
publication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription


def targets_text(targets: Mapping[str, float]) -> str:
    """'dlib 0.75, sface 0.85': each searched recogniser and the distance it had to reach."""
    return ", ".join(f"{k} {float(v):g}" for k, v in targets.items())


def guarantee_line(targets: Mapping[str, float]) -> str:
    """The one-line guarantee the plan, card and dashboard show."""
    return (
        "faces replaced until each is at least the target distance from its original for every "
        f"searched recogniser ({targets_text(targets)}; each recogniser's same-person threshold "
        "lies below its target)"
    )


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    threshold = float(parameters.get("identity_threshold", 0.6))
    margin = float(parameters.get("identity_margin", 0.1))
    # releases made before the recogniser ensemble searched with dlib alone
    targets = parameters.get("search_targets") or {"dlib": threshold + margin}
    held_out = parameters.get("held_out_recognisers")
    withheld = int(parameters.get("n_withheld", 0))
    pixelated = int(parameters.get("n_faces_pixelated", 0))
    generator = parameters.get("generator", "a face generator")
    return MechanismDescription(
        what=(
            f"{n} photographs in which **every detected face was replaced** by a face from "
            f"{generator}, put in place by one affine map on the original's eyes, nose and mouth "
            "(pose and expression kept) and blended by Poisson cloning (lighting and colour kept); "
            "the `face` column holds each photo's largest face, aligned, at 64 x 64. "
            f"{withheld} photograph(s) with no detectable face were withheld (not released); "
            f"{pixelated} face(s) the generator could not move far enough, or too small to "
            "align, were pixelated instead."
        ),
        guarantee=(
            "**Empirical de-identification, not differential privacy.** Each face was replaced "
            "until every recogniser the mechanism searched against put it at least its target "
            f"distance from the original ({targets_text(targets)}), and the audit's face "
            "re-identification attack (verification and rank-1 identification against the "
            "original photos, by each recogniser with its own detection)"
            + (
                f" passed, including {', '.join(held_out)}, which the mechanism never measured"
                if held_out
                else " passed (the card's table says which recognisers were held out from the "
                "search)"
            )
            + ". That is evidence against these recognisers, not a proof: another recogniser, "
            "the hair, clothes, background and the rest of each photo, or an undetected face can "
            "still identify a person. The source dataset's earlier DP guarantees no longer hold "
            "after this release."
        ),
        collection=(
            "Photographs whose detected faces were replaced by generated faces (FALCO-style "
            "latent optimisation on a 64 x 64 DCGAN), checked by a face re-identification attack."
        ),
        collection_type="Derived (de-identified) data",
        tags=("face-anonymization", "de-identification", "anonymized"),
    )
