"""What a face de-identification release is, in the words of its dataset card (no torch: read at
publication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription


def guarantee_line(threshold: float, margin: float) -> str:
    """The one-line guarantee the plan, card and dashboard show."""
    return (
        f"faces replaced until each is at least {threshold + margin:g} from its original in "
        f"identity-embedding distance (same person below {threshold:g})"
    )


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    threshold = float(parameters.get("identity_threshold", 0.6))
    margin = float(parameters.get("identity_margin", 0.1))
    withheld = int(parameters.get("n_withheld", 0))
    pixelated = int(parameters.get("n_faces_pixelated", 0))
    generator = parameters.get("generator", "a face generator")
    embedder = parameters.get("embedder_name", "a face embedding")
    return MechanismDescription(
        what=(
            f"{n} photographs in which **every detected face was replaced** by a face from "
            f"{generator}, blended in with the original's landmarks (pose, expression) and colour "
            "kept; the `face` column holds each photo's largest face, aligned, at 64 x 64. "
            f"{withheld} photograph(s) with no detectable face were withheld (not released); "
            f"{pixelated} face(s) the generator could not move far enough, or too small to "
            "align, were pixelated instead."
        ),
        guarantee=(
            "**Empirical de-identification, not differential privacy.** Each face was replaced "
            f"until {embedder} put it at least {threshold + margin:g} from the original (a pair "
            f"below {threshold:g} counts as the same person), and the audit's face "
            "re-identification attack (verification and rank-1 identification against the "
            "original photos) passed. That is evidence against one recogniser, not a proof: "
            "another recogniser, the hair, clothes, background and the rest of each photo, or "
            "an undetected face can still identify a person. The source dataset's earlier DP "
            "guarantees no longer hold after this release."
        ),
        collection=(
            "Photographs whose detected faces were replaced by generated faces (FALCO-style "
            "latent optimisation on a 64 x 64 DCGAN), checked by a face re-identification attack."
        ),
        collection_type="Derived (de-identified) data",
        tags=("face-anonymization", "de-identification", "anonymized"),
    )
