"""The budget API: a dataset's spend, its per-charge breakdown and the what-if of a planned DP-SGD
run.

The CLI (`budget show|plan`) and the dashboard only display what these return. Every figure is the
ledger's own: epsilon of the whole composed history (never a sum of epsilons), and the cap's privacy
filter, the stop rule `ledger.reserve` applies, for "would this fit".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.calibration import calibrate_dpsgd_sigma
from accounting.epsilon import epsilon_report
from accounting.errors import InvalidParameterError
from accounting.events import DpSgd, event_to_json
from accounting.store import Store
from release.spec import canonical


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class BudgetSummary:
    """A dataset's cap and what its history spent. Epsilons of an empty history are 0; an infinite
    one (no DP guarantee) is inf here, None in `to_dict` (JSON has no infinity)."""

    dataset: str
    dataset_id: str
    epsilon_cap: float
    delta: float
    record_count: int
    spent_epsilon_rdp: float
    spent_epsilon_pld: float
    remaining_epsilon_rdp: float
    dp_void: bool  # a release without a DP guarantee was made: DP guarantees no longer hold
    filter_epsilon: float  # the cap's privacy filter on the history (the cap check)
    odometer_epsilon: float  # holds now and later, however releases were chosen
    charges_counted: int  # charges not refunded

    @property
    def filter_admits_more(self) -> bool:
        return self.filter_epsilon < self.epsilon_cap

    def to_dict(self) -> dict[str, Any]:
        """The `budget show --json` fields."""
        return {
            "dataset": self.dataset,
            "dataset_id": self.dataset_id,
            "epsilon_cap": self.epsilon_cap,
            "delta": self.delta,
            "spent_epsilon_rdp": self.spent_epsilon_rdp,
            "spent_epsilon_pld": self.spent_epsilon_pld,
            "remaining_epsilon_rdp": self.remaining_epsilon_rdp,
            "dp_void": self.dp_void,
            "filter_epsilon": _finite(self.filter_epsilon),
            "filter_admits_more": self.filter_admits_more,
            "odometer_epsilon": _finite(self.odometer_epsilon),
        }


@dataclass(frozen=True)
class ChargeRow:
    """One charge of a dataset: its own epsilon and the epsilon of the history up to and including
    it."""

    position: int
    run_id: str
    state: str
    description: str
    events: str  # what it counts (or, refunded, what it planned), described
    actor: str
    reserved_at: str
    settled_at: str | None
    epsilon_rdp: float
    epsilon_pld: float
    cumulative_epsilon_rdp: float
    cumulative_epsilon_pld: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WhatIf:
    """Epsilon of a planned DP-SGD run, alone or composed with a dataset's history. Changes nothing.
    The cap fields are None when no dataset was given."""

    epsilon_rdp: float
    epsilon_pld: float
    sigma: float
    delta: float
    sample_rate: float
    steps: int
    composed_with: str | None
    described: str  # the planned event, described
    spent_epsilon_rdp: float = 0.0  # the history's RDP epsilon before the run
    epsilon_cap: float | None = None
    filter_epsilon: float | None = None  # the cap's privacy filter after the run
    fits_cap: bool | None = None  # whether the ledger would admit the run
    remaining_after_rdp: float | None = None
    dp_void: bool = False

    @property
    def finite(self) -> bool:
        return math.isfinite(self.epsilon_rdp)

    def to_dict(self) -> dict[str, Any]:
        """The `budget plan --json` fields (the cap's only when composed with a dataset)."""
        out: dict[str, Any] = {
            "epsilon_rdp": self.epsilon_rdp,
            "epsilon_pld": self.epsilon_pld,
            "sigma": self.sigma,
            "delta": self.delta,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "composed_with": self.composed_with,
        }
        if self.epsilon_cap is not None:
            out.update(
                epsilon_cap=self.epsilon_cap,
                filter_epsilon=self.filter_epsilon,
                fits_cap=self.fits_cap,
                remaining_after_rdp=self.remaining_after_rdp,
            )
        return out


def budget(store: Store, dataset: str) -> ledger.Budget:
    """The ledger's composed budget of `dataset` (name or id)."""
    return ledger.budget(store, dataset)


def summary(b: ledger.Budget) -> BudgetSummary:
    d = b.dataset
    return BudgetSummary(
        d.name,
        d.dataset_id,
        d.epsilon_cap,
        d.delta_cap,
        d.record_count,
        b.spent.epsilon_rdp,
        b.spent.epsilon_pld,
        b.remaining_rdp,
        b.dp_void,
        b.filter_epsilon,
        b.odometer_epsilon,
        sum(c.state != "refunded" for c in b.charges),
    )


def breakdown(b: ledger.Budget) -> list[ChargeRow]:
    """Per charge, oldest first: its own epsilon and the cumulative epsilon of the history up to
    it."""
    out, history = [], []
    delta = b.dataset.delta_cap
    for c in b.charges:
        counted = c.counted_events
        history += counted
        own = epsilon_report(counted, delta)
        cum = epsilon_report(history, delta)
        out.append(
            ChargeRow(
                c.position,
                c.run_id,
                c.state,
                c.description,
                "; ".join(e.describe() for e in (counted or c.planned_events)),
                c.actor,
                c.reserved_at,
                c.settled_at,
                own.epsilon_rdp,
                own.epsilon_pld,
                cum.epsilon_rdp,
                cum.epsilon_pld,
            )
        )
    return out


def _prior_and_delta(history: ledger.Budget | None, delta: float | None) -> tuple[list, float]:
    """The history to compose with and the delta to state epsilon at (default: its delta cap),
    refusing a delta above the cap or none at all."""
    prior: list = []
    if history is not None:
        d = history.dataset
        prior = history.history
        if delta is not None and delta > d.delta_cap:
            raise InvalidParameterError(
                f"--delta {delta:g} is above {d.name}'s delta cap {d.delta_cap:g} (which is below "
                f"1/n = {1 / d.record_count:.3g}): its budget is stated at that delta. Leave "
                "--delta out to use the cap, or give a smaller one."
            )
        delta = d.delta_cap if delta is None else delta
    if delta is None:
        raise InvalidParameterError("Give --delta (or --dataset to use its delta cap).")
    return prior, delta


def what_if(
    sample_rate: float,
    steps: int,
    *,
    sigma: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    history: ledger.Budget | None = None,
) -> WhatIf:
    """A DP-SGD run at (q, sigma, steps), or the conservative sigma for a target `epsilon`, composed
    with `history`'s spend when given (delta then defaults to its cap).

    Raises:
        InvalidParameterError: not exactly one of sigma and epsilon; no delta and no history; a
            delta above the history's delta cap.
    """
    if (sigma is None) == (epsilon is None):
        raise InvalidParameterError(
            "Give exactly one of --sigma (to get epsilon) or --epsilon (to get sigma)."
        )
    prior, delta = _prior_and_delta(history, delta)
    if sigma is None:
        assert epsilon is not None
        sigma = calibrate_dpsgd_sigma(epsilon, delta, sample_rate, steps, prior=prior)
    planned = DpSgd(sample_rate, sigma, steps)
    report = epsilon_report(prior + [planned], delta)
    alone = WhatIf(
        report.epsilon_rdp,
        report.epsilon_pld,
        sigma,
        delta,
        sample_rate,
        steps,
        None,
        planned.describe(),
    )
    if history is None:
        return alone
    cap = history.dataset.epsilon_cap
    fits, filter_eps = privacy_filter.cap_check(
        curve.curve_of(prior + [planned]).rdp, cap, history.dataset.delta_cap
    )
    return replace(
        alone,
        composed_with=history.dataset.name,
        spent_epsilon_rdp=history.spent_rdp,
        epsilon_cap=cap,
        filter_epsilon=filter_eps,
        fits_cap=fits,
        remaining_after_rdp=cap - report.epsilon_rdp,
        dp_void=history.dp_void,
    )


def ledger_signature(store: Store) -> str:
    """A cheap digest of every dataset's cap and every charge's state: changes whenever the ledger
    does (a cache key for views that compose the history)."""
    rows: list[Any] = [
        (d.dataset_id, d.epsilon_cap, d.delta_cap) for d in ledger.list_datasets(store)
    ]
    rows += [
        (
            c.dataset_id,
            c.run_id,
            c.state,
            [event_to_json(e) for e in c.charged_events],
            c.settled_at,
        )
        for _, c in ledger.all_charges(store)
    ]
    return hashlib.sha256(canonical(rows)).hexdigest()
