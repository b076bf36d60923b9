"""The cap as a privacy filter: the ledger refuses exactly where the multi-order RDP filter must stop."""

import json
import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.epsilon import RDP_ORDERS
from accounting.errors import BudgetExceededError, LedgerStateError
from accounting.events import DpSgd, GaussianQuery

CAP, DELTA = 2.0, 1e-6


def register(store, cap=CAP, delta=DELTA):
    return ledger.register_dataset(
        store,
        name="d",
        source="builtin:mnist5k",
        fingerprint="a" * 64,
        record_count=5000,
        labels=list(range(10)),
        image_shape=[28, 28],
        epsilon_cap=cap,
        delta_cap=delta,
    )


def gaussian_rdp(sigma: float) -> np.ndarray:
    return privacy_filter.ORDERS / (
        2 * sigma**2
    )  # Mironov 2017, Prop. 7: sensitivity 1, at the filter's orders


def orders_within(sigma: float, cap: float = CAP, delta: float = DELTA) -> int:
    return int(np.sum(gaussian_rdp(sigma) <= privacy_filter.order_budgets(cap, delta)))


def sigma_with_one_order_left() -> float:
    """Bisect the Gaussian's sigma to the point where exactly one order of the grid is within its budget."""
    lo, hi = 0.5, 50.0  # lo: no order within budget, hi: many
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if orders_within(mid) >= 1 else (mid, hi)
    assert orders_within(hi) == 1
    return hi


def test_budget_per_order_is_dp_accountings_conversion_at_its_share_of_delta():
    """Independent check: at (α, B(α)), dp-accounting's conversion (Canonne-Kamath-Steinke) gives exactly ε at
    δ·g(α), the share of δ the theorem gives order α, and at most ε at δ."""
    for alpha, b in zip(privacy_filter.FILTER_ORDERS, privacy_filter.order_budgets(CAP, DELTA)):
        if b <= 0:
            continue
        eps_share, _ = rdp_lib.compute_epsilon([alpha], [b], DELTA * privacy_filter.slack(alpha))
        assert eps_share == pytest.approx(CAP, rel=1e-12)
        assert rdp_lib.compute_epsilon([alpha], [b], DELTA)[0] <= CAP


def test_the_grid_meets_the_theorems_condition_and_the_full_grid_would_not():
    assert sum(privacy_filter.slack(a) for a in privacy_filter.FILTER_ORDERS) <= 1.0
    assert set(privacy_filter.FILTER_ORDERS) <= set(RDP_ORDERS)
    assert (
        sum(privacy_filter.slack(a) for a in RDP_ORDERS) > 1.0
    )  # why the filter does not use all 156 orders


@pytest.mark.parametrize("alpha", [2.0, 3.0, 8.0, 63.0])
def test_holder_step_costs_at_most_delta_times_g(alpha):
    """Step (3) of the proof: max over q of (e^B q)^(1-1/α) - e^ε q equals δ·g(α) (numerically, on a fine grid)."""
    b = privacy_filter.order_budgets(CAP, DELTA)[privacy_filter.FILTER_ORDERS.index(alpha)]
    q = np.exp(np.linspace(math.log(1e-20), 0, 400_001))
    worst = np.max((math.exp(b) * q) ** (1 - 1 / alpha) - math.exp(CAP) * q)
    assert worst == pytest.approx(DELTA * privacy_filter.slack(alpha), rel=1e-4)


def test_filter_epsilon_is_never_below_the_reported_epsilon():
    rng = np.random.default_rng(0)
    # 48 histories: 16 random (q, sigma), each at 3 random step counts (a step's curve is computed
    # once per (q, sigma), ~0.04 s; T steps are that curve times T)
    for _ in range(16):
        q, sigma = float(rng.uniform(0.001, 0.1)), float(rng.uniform(0.6, 3.0))
        for steps in rng.integers(1, 3000, size=3):
            c = curve.curve_of([DpSgd(q, sigma, int(steps))])
            assert privacy_filter.filter_epsilon(c.rdp, DELTA) >= c.epsilon(DELTA) - 1e-12


def test_one_order_within_budget_is_enough_and_none_is_refused(store):
    register(store)
    sigma = sigma_with_one_order_left()
    ledger.reserve(
        store, "d", [GaussianQuery(sigma)], "one-order-left"
    )  # every order but one over B: passes
    assert ledger.budget(store, "d").filter_epsilon <= CAP + 1e-9
    with pytest.raises(BudgetExceededError, match="privacy filter"):
        ledger.reserve(
            store, "d", [GaussianQuery(1e3)], "any-more"
        )  # a tiny extra charge: every order over B


def test_every_order_over_budget_is_refused_and_nothing_changes(store):
    register(store)
    sigma = sigma_with_one_order_left() * (1 - 1e-6)
    assert orders_within(sigma) == 0
    before = (
        store.query("SELECT * FROM charges"),
        store.query("SELECT * FROM audit_trail ORDER BY seq"),
    )
    with pytest.raises(BudgetExceededError, match="over the cap 2"):
        ledger.reserve(store, "d", [GaussianQuery(sigma)], "over")
    assert (
        store.query("SELECT * FROM charges"),
        store.query("SELECT * FROM audit_trail ORDER BY seq"),
    ) == before


def test_boundary_within_float_tolerance(store):
    """A Gaussian whose curve meets B(α) exactly at its binding order (other orders over) is admitted; the same
    run against a cap smaller by 1e-6 is refused."""
    lo, hi = 0.5, 50.0  # bisect sigma until min over α of (α/(2σ²) - B(α)) is 0 to float precision
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if orders_within(mid) >= 1 else (mid, hi)
    sigma = hi
    on_grid = curve.curve_of([GaussianQuery(sigma)]).rdp[
        [RDP_ORDERS.index(a) for a in privacy_filter.FILTER_ORDERS]
    ]
    assert (
        abs(np.max(privacy_filter.order_budgets(CAP, DELTA) - on_grid)) < 1e-12
    )  # the binding order sits on B
    rdp = curve.curve_of([GaussianQuery(sigma)]).rdp
    assert privacy_filter.admits(rdp, CAP, DELTA)
    assert not privacy_filter.admits(rdp, CAP - 1e-6, DELTA)
    register(store)
    ledger.reserve(store, "d", [GaussianQuery(sigma)], "exact")
    assert ledger.budget(store, "d").filter_epsilon == pytest.approx(CAP, abs=1e-9)


def test_the_filter_refuses_histories_the_tighter_conversion_would_pass(store):
    """The stop rule uses the conversion the theorem covers: a history whose reported (fixed-sequence) RDP epsilon
    is below the cap but whose filter epsilon is above it is refused."""
    register(store)
    events = [DpSgd(0.01, 1.0, t) for t in range(100, 20000, 50)]
    pick = next(
        e
        for e in events
        if curve.curve_of([e]).epsilon(DELTA)
        < CAP
        < privacy_filter.filter_epsilon(curve.curve_of([e]).rdp, DELTA)
    )
    with pytest.raises(BudgetExceededError):
        ledger.reserve(store, "d", [pick], "between")


def test_commit_may_not_exceed_the_reservation_at_any_order(store):
    """The filter admitted the reserved curve; an executed event that costs less epsilon but more RDP at some order
    (here: a few subsampled steps instead of one plain Gaussian query: cheaper at low orders, dearer at high
    ones) is refused at commit."""
    register(store, cap=8.0)
    planned = [GaussianQuery(3.0)]
    executed = [DpSgd(0.01, 1.0, 10)]
    p, e = curve.curve_of(planned), curve.curve_of(executed)
    assert e.epsilon(DELTA) < p.epsilon(DELTA) and np.any(e.rdp > p.rdp)
    ledger.reserve(store, "d", planned, "r")
    with pytest.raises(LedgerStateError, match="executed more"):
        ledger.commit(store, "r", executed)
    assert ledger.get_charge(store, "r").state == "reserved"


def test_budget_plan_asks_the_filter_not_the_fixed_sequence_epsilon(tmp_path):
    """A what-if whose RDP epsilon fits the cap but whose filter epsilon does not is reported as not fitting."""
    from typer.testing import CliRunner

    from release.cli import app

    runner, ws = CliRunner(), str(tmp_path / "ws")
    assert runner.invoke(app, ["--workspace", ws, "init", "--steward", "alice"]).exit_code == 0
    assert (
        runner.invoke(
            app,
            [
                "--workspace",
                ws,
                "dataset",
                "register",
                "mnist",
                "--source",
                "builtin:mnist5k",
                "--epsilon",
                "2",
                "--delta",
                "1e-5",
                "--as",
                "alice",
            ],
        ).exit_code
        == 0
    )
    r = runner.invoke(
        app,
        [
            "--workspace",
            ws,
            "budget",
            "plan",
            "--sigma",
            "1.0",
            "--sample-rate",
            "0.01",
            "--steps",
            "600",
            "--dataset",
            "mnist",
            "--json",
        ],
    )
    out = json.loads(r.output)
    assert out["epsilon_rdp"] < 2.0 < out["filter_epsilon"] and out["fits_cap"] is False
