"""The cap as a privacy filter: the ledger refuses exactly where the multi-order RDP filter must stop."""
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
    return ledger.register_dataset(store, name="d", source="builtin:mnist5k", fingerprint="a" * 64, record_count=5000,
                                   labels=list(range(10)), image_shape=[28, 28], epsilon_cap=cap, delta_cap=delta)


def gaussian_rdp(sigma: float) -> np.ndarray:
    return np.asarray(RDP_ORDERS) / (2 * sigma ** 2)  # Mironov 2017, Prop. 7: sensitivity 1


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


def test_budget_per_order_agrees_with_dp_accountings_conversion():
    """Independent check: dp-accounting's (tighter) conversion at (α, B(α)) gives exactly ε minus its documented
    improvement over Mironov's, so B(α) is Mironov's budget and never looser than what epsilon reports."""
    for alpha in (1.5, 2.0, 3.0, 8.0, 32.0, 256.0):
        i = RDP_ORDERS.index(alpha)
        b = privacy_filter.order_budgets(CAP, DELTA)[i]
        if b <= 0:
            continue
        eps_dp, _ = rdp_lib.compute_epsilon([alpha], [b], DELTA)
        improvement = math.log(alpha) / (alpha - 1) - math.log1p(-1 / alpha)
        assert eps_dp == pytest.approx(CAP - improvement, rel=1e-12, abs=1e-12)
        assert eps_dp <= CAP


def test_filter_epsilon_is_never_below_the_reported_epsilon():
    rng = np.random.default_rng(0)
    for _ in range(50):
        events = [DpSgd(float(rng.uniform(0.001, 0.1)), float(rng.uniform(0.6, 3.0)), int(rng.integers(1, 3000)))]
        c = curve.curve_of(events)
        assert privacy_filter.filter_epsilon(c.rdp, DELTA) >= c.epsilon(DELTA) - 1e-12


def test_one_order_within_budget_is_enough_and_none_is_refused(store):
    register(store)
    sigma = sigma_with_one_order_left()
    ledger.reserve(store, "d", [GaussianQuery(sigma)], "one-order-left")  # every order but one over B: passes
    assert ledger.budget(store, "d").filter_epsilon <= CAP + 1e-9
    with pytest.raises(BudgetExceededError, match="privacy filter"):
        ledger.reserve(store, "d", [GaussianQuery(1e3)], "any-more")  # a tiny extra charge: every order over B


def test_every_order_over_budget_is_refused_and_nothing_changes(store):
    register(store)
    sigma = sigma_with_one_order_left() * (1 - 1e-6)
    assert orders_within(sigma) == 0
    before = (store.query("SELECT * FROM charges"), store.query("SELECT * FROM audit_trail ORDER BY seq"))
    with pytest.raises(BudgetExceededError, match="over the cap 2"):
        ledger.reserve(store, "d", [GaussianQuery(sigma)], "over")
    assert (store.query("SELECT * FROM charges"), store.query("SELECT * FROM audit_trail ORDER BY seq")) == before


def test_boundary_within_float_tolerance(store):
    """A Gaussian whose curve meets B(α) exactly at its binding order (other orders over) is admitted; the same
    run against a cap smaller by 1e-6 is refused."""
    lo, hi = 0.5, 50.0  # bisect sigma until min over α of (α/(2σ²) - B(α)) is 0 to float precision
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if orders_within(mid) >= 1 else (mid, hi)
    sigma = hi
    slack = privacy_filter.order_budgets(CAP, DELTA) - curve.curve_of([GaussianQuery(sigma)]).rdp
    assert abs(np.max(slack)) < 1e-12  # the binding order sits on its budget
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
    pick = next(e for e in events if curve.curve_of([e]).epsilon(DELTA) < CAP
                < privacy_filter.filter_epsilon(curve.curve_of([e]).rdp, DELTA))
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
