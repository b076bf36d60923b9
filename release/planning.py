"""What planning a spec shows before anything is stored: the mechanism's config and plan, the
policy checked, epsilon before and after (RDP, PLD), the warnings, and the cap's refusal with the
largest target that would fit (accounting.largest_target). Reads no sensitive data, charges
nothing; release.manager stores the plan (`create_plan`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from accounting import calibration, curve, ledger
from accounting import filter as privacy_filter
from accounting.epsilon import EpsilonReport, epsilon_report
from accounting.errors import BudgetExceededError, InvalidParameterError
from accounting.events import MechanismEvent, event_to_json
from accounting.largest_target import largest_target
from accounting.store import Store
from release import kinds
from release.artifacts import public_sha256
from release.data import dataset_info
from release.spec import Plan, ReleaseSpec
from synth import registry
from synth.kinds.datasets import load_public
from synth.progress import ProgressFn, no_progress
from synth.registry import Data, MechanismPlan


@dataclass(frozen=True)
class Preview:
    """What planning a spec shows: the mechanism's plan, epsilon before and after it, the warnings,
    and the cap's refusal (None: the filter admits it)."""

    plan: MechanismPlan
    before: EpsilonReport
    after: EpsilonReport
    warnings: list[str]
    refusal: str | None


def mechanism_config(spec: ReleaseSpec, ds: ledger.Dataset) -> Any:
    mech = registry.get(spec.mechanism)
    return mech.make_config(spec.config_overrides(), dataset_info(ds), spec.n_images, spec.preset)


def mechanism_plan(spec: ReleaseSpec, budget: ledger.Budget, public: Data | None) -> MechanismPlan:
    info = dataset_info(budget.dataset)
    registry.check_data_kind(spec.mechanism, info)  # a mechanism on data of another kind
    kinds.of_mechanism(spec.mechanism)  # what it releases is a known output kind
    return registry.get(spec.mechanism).plan(
        mechanism_config(spec, budget.dataset), info, budget.history, public
    )


def check_policy(spec: ReleaseSpec) -> None:
    from audit import AuditPolicy

    AuditPolicy.from_dict(spec.policy)  # raises InvalidParameterError naming the bad value


def stage(progress: ProgressFn, name: str):
    """progress for one stage of planning, labelled "plan: NAME"."""
    return lambda done, total: progress(f"plan: {name}", done, total)


def plan_public(spec: ReleaseSpec, ds: ledger.Dataset, progress: ProgressFn) -> Data | None:
    """The public data the spec names (checked disjoint from the sensitive source)."""
    step = stage(progress, "public data and mechanism")
    step(0, 1)
    public = load_public(spec.public_source, ds.source)
    registry.get(spec.mechanism)  # imports the mechanism (torch): seconds on a slow machine
    step(1, 1)
    return public


def previewed(
    spec: ReleaseSpec,
    budget: ledger.Budget,
    public: Data | None,
    progress: ProgressFn = no_progress,
) -> Preview:
    """Validate everything a run will use and ask the mechanism for its plan (no sensitive data
    read). `progress` sees each stage, the noise calibration's accountant evaluations included."""
    check_policy(spec)
    ds = budget.dataset
    with calibration.reporting(lambda stage, done, total: progress(f"plan: {stage}", done, total)):
        mplan = mechanism_plan(spec, budget, public)
    from audit import AuditPolicy

    # what the kind's checks could not judge is refused before anything is stored
    kinds.of_mechanism(spec.mechanism).audit.check_plan(
        spec.mechanism, mplan.detail, AuditPolicy.from_dict(spec.policy)
    )
    accounting_stage = stage(progress, "epsilon before and after (RDP, PLD)")
    accounting_stage(0, 2)
    before = epsilon_report(budget.history, ds.delta_cap)
    accounting_stage(1, 2)
    after = epsilon_report(budget.history + list(mplan.events), ds.delta_cap)
    accounting_stage(2, 2)
    warnings = list(mplan.warnings)
    if mplan.guarantee_kind == "k-anonymity":
        from release.kanon_estimate import plan_warning

        warnings += plan_warning(spec, ds, mplan, public, progress)
    if budget.dp_void:
        warnings.append(
            "A release without a DP guarantee (k-anonymity, de-identification) was already made "
            "from this dataset: its DP guarantees no longer hold."
        )
    rdp_after = curve.curve_of(
        budget.history + list(mplan.events)
    ).rdp  # the cap is a privacy filter on this curve
    refusal = None
    if mplan.guarantee_kind == "dp" and not privacy_filter.admits(
        rdp_after, ds.epsilon_cap, ds.delta_cap
    ):
        refusal = (
            "The cap's privacy filter would stop this release (filter epsilon after it "
            f"{privacy_filter.filter_epsilon(rdp_after, ds.delta_cap):.3f} > cap "
            f"{ds.epsilon_cap:g}; RDP epsilon {after.epsilon_rdp:.3f}): its plan will be refused "
            "and no run of it admitted. "
            + fitting_target_hint(
                spec, budget, public, progress=stage(progress, "largest target that fits")
            )
        )
    return Preview(mplan, before, after, warnings, refusal)


def events_at(spec: ReleaseSpec, budget: ledger.Budget, public: Data | None):
    """The events the spec's mechanism would charge at target epsilon `t` (no data read); None
    where no plan exists at `t`: too small to calibrate, or at or below what the dataset has
    already spent."""

    def events(epsilon: float) -> tuple[MechanismEvent, ...] | None:
        at_target = replace(spec, mechanism_params={**spec.mechanism_params, "epsilon": epsilon})
        try:
            with calibration.reporting(no_progress):  # one bar for the search, not one per plan
                return mechanism_plan(at_target, budget, public).events
        except (InvalidParameterError, BudgetExceededError):
            return None

    return events


def fitting_target_hint(
    spec: ReleaseSpec,
    budget: ledger.Budget,
    public: Data | None,
    rounds: int = 8,
    progress=lambda done, total: None,
) -> str:
    """The largest target epsilon whose plan the cap's filter admits, by bisection over plans
    between the history's spend and the target (`rounds` of them, rounded down to 2 decimals)."""
    target = registry.target_epsilon(mechanism_config(spec, budget.dataset))
    if target is None:
        return ""
    ds = budget.dataset
    suggestion = largest_target(
        budget.history,
        events_at(spec, budget, public),
        target,
        ds.epsilon_cap,
        ds.delta_cap,
        rounds=rounds,
        progress=progress,
    )
    if suggestion is None:
        return "No positive target epsilon fits what is left of the cap."
    return (
        f"The largest target that fits is about epsilon = {suggestion:g} (set `epsilon = "
        f"{suggestion:g}` in the spec's [{spec.mechanism}] table), or raise the dataset's cap."
    )


def preview(store: Store, spec: ReleaseSpec, progress: ProgressFn = no_progress) -> dict[str, Any]:
    """What planning `spec` would show (events, epsilon before/after, warnings); stores nothing,
    reads no sensitive data, charges nothing."""
    budget = ledger.budget(store, spec.dataset)
    shown = previewed(spec, budget, plan_public(spec, budget.dataset, progress), progress)
    mplan, refusal = shown.plan, shown.refusal
    return {
        "events_described": [e.describe() for e in mplan.events],
        "epsilon_before": shown.before.as_dict(),
        "epsilon_after": shown.after.as_dict(),
        "expected_count": int(mplan.expected_count),
        "warnings": shown.warnings + ([refusal] if refusal else []),  # a what-if: said, not refused
        "requires_acknowledgement": mplan.requires_acknowledgement,
        "choices": list(mplan.detail.get("choices", ())),
    }


def plan_record(
    release_id: str,
    spec: ReleaseSpec,
    budget: ledger.Budget,
    public: Data | None,
    shown: Preview,
) -> Plan:
    """The plan a steward signs: the whole spec, the dataset and public data it binds, what it
    charges and the epsilon before and after."""
    mplan, before, after = shown.plan, shown.before, shown.after
    ds = budget.dataset
    return Plan(
        release_id=release_id,
        dataset_id=ds.dataset_id,
        dataset=ds.name,
        dataset_fingerprint=ds.fingerprint,
        mechanism=spec.mechanism,
        spec=spec.as_dict(),
        spec_file=spec.source_file,
        events=[event_to_json(e) for e in mplan.events],
        events_described=[e.describe() for e in mplan.events],
        epsilon_before=before.as_dict(),
        epsilon_after=after.as_dict(),
        epsilon_cap=ds.epsilon_cap,
        remaining_after_rdp=(ds.epsilon_cap - after.epsilon_rdp) if after.finite else None,
        expected_count=int(mplan.expected_count),
        output_shape=list(mplan.output_shape),
        warnings=shown.warnings,
        requires_acknowledgement=mplan.requires_acknowledgement,
        guarantee_kind=mplan.guarantee_kind,
        config=json.loads(json.dumps(dict(mplan.parameters))),
        mechanism_plan=json.loads(json.dumps(dict(mplan.detail))),
        public_source=spec.public_source,
        public_sha256=public_sha256(public),
        ledger_position=len(budget.charges),
    )
