"""What a deface or reface release is, in the words of its plan, card and dashboard (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription

NOT_PROTECTED = (
    "It does *not* protect against re-identification from the brain itself (brain shape and "
    "folding patterns are individual and can be matched to another scan of the same person), "
    "nor from anything outside the volumes (file names, the BIDS sidecars or clinical data they "
    "travel with); the released NIfTI headers keep only geometry and scaling (free-text fields "
    "such as `descrip` and header extensions are dropped; voxels are written little-endian, a "
    "big-endian input's values unchanged), and the files are renamed by release id. Dataset "
    "size is public. No epsilon is claimed: this is not differential privacy, and "
    "after it the source dataset's DP guarantees no longer hold."
)


def what(mechanism: str, parameters: Mapping[str, Any]) -> str:
    """One line for the plan and the dashboard."""
    margin = parameters.get("brain_margin_mm")
    if mechanism == "reface":
        face = parameters.get("face", "template")
        return (
            f"refaced (face replaced by the {face!r} face model, brain and a {margin:g} mm margin "
            "kept bit-for-bit); empirical de-identification, no DP"
        )
    return (
        f"defaced ({parameters.get('method')}: face removed, brain and a {margin:g} mm margin "
        "kept bit-for-bit); empirical de-identification, no DP"
    )


def describe_deface(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    method = parameters.get("method", "quickshear")
    how = (
        "everything below the plane quickshear fits under the front of the brain (Schimke & Hale "
        "2011) set to background"
        if method == "quickshear"
        else "the voxels of pydeface's face mask, registered to each head with an affine "
        "transform, set to background"
    )
    return MechanismDescription(
        what=(
            f"{n} head MRI volumes (NIfTI) of the sensitive dataset, **defaced**: {how}. Every "
            f"voxel within {parameters.get('brain_margin_mm', 0):g} mm of the registered brain is "
            "bit-for-bit the original's."
        ),
        guarantee=(
            "**Empirical de-identification** (defacing): the face, from which a surface render "
            "can be matched to a photograph, is removed; the audit checked that every brain voxel "
            "is unchanged, that the face region no longer correlates with the original and that "
            "renders of the released heads are not re-identified among the originals better "
            f"than chance. {NOT_PROTECTED}"
        ),
        collection=(
            "Each volume is a sensitive head MRI with its face removed (defacing); the brain is "
            "the original's."
        ),
        collection_type="Derived (de-identified) data",
        tags=("mri", "defaced", "de-identified"),
    )


def describe_reface(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    face = parameters.get("face", "template")
    return MechanismDescription(
        what=(
            f"{n} head MRI volumes (NIfTI) of the sensitive dataset, **refaced**: the face "
            f"replaced by the {face!r} face model's (the default: pydeface's average face, "
            "registered to each head and matched to its intensities), in the spirit of "
            "mri_reface. Every voxel within "
            f"{parameters.get('brain_margin_mm', 0):g} mm of the registered brain is bit-for-bit "
            "the original's."
        ),
        guarantee=(
            "**Empirical de-identification** (refacing): the subject's face is replaced by "
            "another, so tools that expect a whole head keep working while a surface render no "
            "longer shows the subject; the audit checked that every brain voxel is unchanged, "
            "that the face region's detail no longer correlates with the original and that "
            "renders of the released heads are not re-identified among the originals better "
            f"than chance. {NOT_PROTECTED}"
        ),
        collection=(
            "Each volume is a sensitive head MRI whose face was replaced by a template face "
            "(refacing); the brain is the original's."
        ),
        collection_type="Derived (de-identified) data",
        tags=("mri", "refaced", "de-identified"),
    )
