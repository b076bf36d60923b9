"""A PrivImage plan's choices in a steward's words: what pre-trains the model, which warm-ups run
and why, and what DP-SGD is left with. Shown by `synth privimage`, `release plan`, `release show`
and the dashboard before anyone approves the plan; stored in it, so its digest covers them."""

from __future__ import annotations

from synth.mechanisms.privimage.central import pixel_noise_std
from synth.mechanisms.privimage.config import CENTRAL_AUTO, FREQUENCY_AUTO, PrivImageConfig
from synth.mechanisms.privimage.frequency import noise_share
from synth.mechanisms.privimage.plan import PrivImagePlan

_PRETRAINING = {
    "semantic": "the {k} public classes nearest each sensitive class (picked by a DP query of "
    "the sensitive images)",
    "none": "none (the model starts untrained)",
    "all": "every public image (no selection)",
    "procedural": "generated shapes and textures (no public images)",
}


def plan_choices(config: PrivImageConfig, plan: PrivImagePlan, n_classes: int) -> list[str]:
    """The lines, from the plan and public metadata only (the record and class counts)."""
    per_class = plan.record_count / max(n_classes, 1)
    lines = [f"pre-training data: {_PRETRAINING[config.selection].format(k=config.k)}"]
    warm = noise_share(config.frequency_sigma, config.frequency_features, per_class)
    lines.append(
        _warmup_line(
            "frequency warm-up",
            f"on (a DP random-feature generator's drawings pre-train the model; noise {warm:.2f} "
            "of a class's mean embedding)"
            if plan.frequency
            else None,
            f"noise {warm:.2f} of a class's mean embedding would drown it",
            config.frequency_warmup == FREQUENCY_AUTO,
        )
    )
    noise = pixel_noise_std(config.central_sigma, config.central_clip, per_class)
    central = plan.central_event
    lines.append(
        _warmup_line(
            "central images",
            f"{central.count} per class (DP class means pre-train the model; noise {noise:.3f} "
            "of the pixel range)"
            if central is not None
            else None,
            f"noise {noise:.2f} of the pixel range on a class mean would wreck the samples",
            config.central_images == CENTRAL_AUTO,
        )
    )
    lines.append(
        f"DP-SGD: {plan.steps:,} steps at noise multiplier {plan.noise_multiplier:.3g}, about "
        f"{round(plan.expected_batch)} images a step (what epsilon leaves after the events above)"
    )
    if config.vote_sigma:
        lines.append(
            f"private vote: {config.vote_rounds} round{'s' if config.vote_rounds > 1 else ''}, "
            f"each released image chosen from {config.vote_pool} candidates (noise std "
            f"{config.vote_sigma:g} on the votes)"
        )
    return lines


def _warmup_line(name: str, on: str | None, why_off: str, by_auto: bool) -> str:
    """One warm-up's line: what it does where on (`on`), else off; where auto decided, why."""
    auto = "; chosen by auto" if by_auto else ""
    if on is not None:
        return f"{name}: {on}{auto}"
    return f"{name}: off ({why_off}){auto}" if by_auto else f"{name}: off"
