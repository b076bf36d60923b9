"""What a DP-MERF release is, in the words of its dataset card (no torch: read at publication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    labels = ""
    guaranteed = "the synthetic images and labels (one Gaussian query: the noisy embedding)"
    if parameters.get("teacher_labels"):
        labels = (
            " The labels come from a small classifier trained with DP-SGD on the sensitive "
            f"images (noise multiplier {parameters.get('teacher_noise_multiplier', 0):.3g}, "
            f"{parameters.get('teacher_steps')} steps); it kept the generator's class for "
            f"{100 * float(parameters.get('teacher_label_agreement', 0)):.0f}% of the images, so "
            "the classes need not be balanced."
        )
        guaranteed = (
            "the synthetic images and labels (two events: the noisy embedding's Gaussian query "
            "and the label classifier's DP-SGD)"
        )
    collapsed = list(parameters.get("collapsed_classes") or [])
    if collapsed:
        labels += (
            f" Warning: the generator did not learn class(es) {collapsed} (every training attempt "
            "drew something else for them), so their images do not show that class."
        )
    share = float(parameters.get("perceptual_share") or 0)
    summary = f"{parameters.get('n_features')} random Fourier features"
    if share:
        summary += (
            f" and, with {100 * share:.0f}% of the weight, texture statistics of a public "
            "ImageNet-pretrained network (EfficientNet-Lite0),"
        )
    return MechanismDescription(
        what=(
            f"{n} **synthetic** labelled images drawn from a small generator trained with DP-MERF: "
            f"the sensitive images were summarised once as {summary} averaged per class, with "
            "Gaussian noise (std "
            f"{parameters.get('sigma', 0):.3g}), and the generator learned to match that noisy "
            "summary; it never saw an image. No image in this bundle is a record of the "
            "sensitive dataset. Expect blurry, average-looking images: DP-MERF is a fast "
            "baseline, not a detailed generator." + labels
        ),
        guarantee=guaranteed,
        collection=(
            "Synthetic images drawn from a generator trained against a differentially private "
            "random-feature mean embedding of each class of a sensitive image dataset (DP-MERF)."
        ),
    )
