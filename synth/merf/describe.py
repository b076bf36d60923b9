"""What a DP-MERF release is, in the words of its dataset card (no torch: read at publication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    return MechanismDescription(
        what=(
            f"{n} **synthetic** labelled images drawn from a small generator trained with DP-MERF: "
            f"the sensitive images were summarised once as {parameters.get('n_features')} random "
            "Fourier features averaged per class, with Gaussian noise (std "
            f"{parameters.get('sigma', 0):.3g}), and the generator learned to match that noisy "
            "summary; it never saw an image. No image in this bundle is a record of the "
            "sensitive dataset. Expect blurry, average-looking images: DP-MERF is a fast "
            "baseline, not a detailed generator."
        ),
        guarantee="the synthetic images and labels (one Gaussian query: the noisy embedding)",
        collection=(
            "Synthetic images drawn from a generator trained against a differentially private "
            "random-feature mean embedding of each class of a sensitive image dataset (DP-MERF)."
        ),
    )
