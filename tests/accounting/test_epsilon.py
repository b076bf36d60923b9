"""Epsilon by RDP and PLD, cross-checked against opacus' RDP analysis and closed forms."""

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis import rdp as opacus_rdp
from scipy.stats import norm

from accounting.epsilon import RDP_ORDERS, epsilon_pld, epsilon_rdp, epsilon_report
from accounting.events import (
    DpSgd,
    GaussianQuery,
    NonPrivateRelease,
    compose,
    event_from_json,
    event_to_json,
    events_from_text,
    events_to_text,
)


def analytic_gaussian_delta(eps: float, mu: float) -> float:
    """Balle & Wang (2018): exact delta(eps) of a Gaussian mechanism with sensitivity/sigma = mu."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    from scipy.optimize import brentq

    return brentq(lambda e: analytic_gaussian_delta(e, 1 / sigma) - delta, 0, 500)


@pytest.mark.parametrize(
    "q,sigma,steps", [(0.01, 1.0, 1000), (0.004, 0.8, 2500), (0.1, 2.0, 300), (1.0, 5.0, 20)]
)
def test_dpsgd_rdp_matches_opacus(q, sigma, steps):
    delta = 1e-5
    ours = epsilon_rdp([DpSgd(q, sigma, steps)], delta)
    orders = list(RDP_ORDERS)
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    theirs, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    assert ours == pytest.approx(theirs, rel=1e-3)


@pytest.mark.parametrize("q,sigma", [(0.01, 1.0), (0.2, 1.5), (1.0, 3.0)])
def test_rdp_curves_agree_order_by_order(q, sigma):
    """Same RDP values at every integer order in both libraries (conversion to epsilon aside). At
    fractional orders below 2 the two libraries use different (both valid) bounds, so they differ."""
    orders = [float(a) for a in RDP_ORDERS if float(a).is_integer()]
    acc = dp_accounting.rdp.RdpAccountant(orders=orders)
    acc.compose(DpSgd(q, sigma, 7).to_dp_event())
    ours = np.asarray(acc._rdp)  # the accountant's per-order RDP
    theirs = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=orders)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.0, 5.0])
def test_single_gaussian_rdp_closed_form(sigma):
    acc = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(GaussianQuery(sigma=3 * sigma, sensitivity=3).to_dp_event())
    np.testing.assert_allclose(acc._rdp, np.asarray(RDP_ORDERS) / (2 * sigma**2), rtol=1e-9)


@pytest.mark.parametrize("sigma,delta", [(0.8, 1e-5), (1.0, 1e-5), (2.0, 1e-6), (5.0, 1e-3)])
def test_single_gaussian_pld_matches_analytic_and_rdp_is_an_upper_bound(sigma, delta):
    exact = analytic_gaussian_epsilon(sigma, delta)
    pld = epsilon_pld([GaussianQuery(sigma)], delta)
    rdp = epsilon_rdp([GaussianQuery(sigma)], delta)
    assert pld == pytest.approx(exact, abs=2e-3)  # PLD is exact up to discretisation (pessimistic)
    assert pld >= exact - 1e-9
    assert rdp >= exact


def test_composition_is_not_addition_and_grouping_is_exact():
    e = DpSgd(0.01, 1.0, 100)
    one = epsilon_rdp([e], 1e-5)
    ten = epsilon_rdp([e] * 10, 1e-5)
    assert ten < 10 * one  # RDP composition is sublinear, never a sum of epsilons
    assert ten == pytest.approx(epsilon_rdp([DpSgd(0.01, 1.0, 1000)], 1e-5), rel=1e-9)
    raw = dp_accounting.ComposedDpEvent([e.to_dp_event()] * 10)
    assert epsilon_rdp(raw, 1e-5) == pytest.approx(ten, rel=1e-9)


def test_non_private_release_voids_dp():
    r = epsilon_report([DpSgd(0.01, 1.0, 10), NonPrivateRelease("k-anonymous k=5")], 1e-5)
    assert math.isinf(r.epsilon_rdp) and math.isinf(r.epsilon_pld)
    assert r.as_dict()["epsilon_rdp"] is None


def test_empty_history_costs_nothing():
    assert epsilon_rdp([], 1e-5) == 0


events_strategy = st.one_of(
    st.builds(
        GaussianQuery, st.floats(1.0, 100), st.floats(0.1, 10), st.integers(1, 50)
    ),  # ratio >= 0.1
    st.builds(DpSgd, st.floats(1e-4, 1.0), st.floats(0.3, 20), st.integers(1, 10_000)),
    st.builds(NonPrivateRelease, st.text(max_size=20)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(events_strategy, max_size=6))
def test_events_round_trip_json(events):
    assert events_from_text(events_to_text(events)) == events
    for e in events:
        data = event_to_json(e)
        assert data["dp_event"]["type"] in {
            "GaussianDpEvent",
            "SelfComposedDpEvent",
            "PoissonSampledDpEvent",
            "NonPrivateDpEvent",
        }
        assert event_from_json(data).to_dp_event() == e.to_dp_event()


def test_stored_dp_event_must_match_parameters():
    data = event_to_json(DpSgd(0.01, 1.0, 100))
    data["dp_event"]["count"] = 1  # tampered: fewer steps than the parameters say
    with pytest.raises(Exception, match="does not match"):
        event_from_json(data)


def test_independent_recompute_from_json_with_dp_accounting_alone():
    """An auditor rebuilds the DpEvent from stored JSON with dp-accounting and gets the same epsilon."""
    from accounting.events import dp_event_from_json

    history = [GaussianQuery(20, 3**0.5), DpSgd(0.02, 1.1, 400)]
    stored = [event_to_json(e)["dp_event"] for e in history]
    acc = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(dp_accounting.ComposedDpEvent([dp_event_from_json(d) for d in stored]))
    assert acc.get_epsilon(1e-5) == pytest.approx(epsilon_rdp(compose(history), 1e-5), rel=1e-12)
