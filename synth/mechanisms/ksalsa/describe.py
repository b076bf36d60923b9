"""What a k-SALSA release is, in the words of its dataset card (no torch: read at publication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    k, method = guarantee.get("k"), guarantee.get("method") or parameters.get("method")
    return MechanismDescription(
        what=(
            f"{n} images, each the **average of k = {k} records** of the sensitive dataset "
            f"(method: {method}), with the majority label of its group and the group's label "
            "distribution."
        ),
        guarantee=(
            f"**k-anonymity with k = {k}**: each released image is computed from a group of {k} "
            "records. This is *not* differential privacy. Averages can leak attributes shared by "
            "a group, and the source dataset's earlier DP guarantees no longer hold after this "
            "release."
        ),
        collection=(
            "Each image averages k records of a sensitive image dataset (k-SALSA family of "
            "k-anonymity methods)."
        ),
        collection_type="Derived (aggregated) data",
        tags=("k-anonymity", "anonymized"),
    )
