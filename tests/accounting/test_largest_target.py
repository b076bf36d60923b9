"""accounting.largest_target: the largest target epsilon a cap admits, on a toy mechanism (one
Gaussian query whose noise shrinks as the target grows) checked against an independent bisection
on the Gaussian's closed-form RDP and the filter's order budgets."""

from __future__ import annotations

import math

import pytest

from accounting.events import GaussianQuery
from accounting.filter import FILTER_ORDERS
from accounting.largest_target import admits, largest_target, spent

CAP, DELTA = 3.0, 1e-5


def toy_events(target: float) -> list[GaussianQuery]:
    """Monotone: a larger target, less noise (sigma = 2 / target)."""
    return [GaussianQuery(2.0 / target)]


def gaussian_fits(sigmas: list[float], cap: float, delta: float) -> bool:
    """Independent of accounting.curve: a Gaussian of sensitivity 1 is (a, a / (2 sigma^2))-RDP;
    the filter admits iff some order a keeps the sum <= cap - log(1/delta) / (a - 1)."""
    return any(
        sum(a / (2 * s * s) for s in sigmas) <= cap - math.log(1 / delta) / (a - 1) + 1e-9
        for a in FILTER_ORDERS
    )


def reference(prior: list[float], cap: float, delta: float, upper: float) -> float:
    """The admissible boundary in (0, upper), by 60 halvings of the independent predicate."""
    lo, hi = 0.0, upper
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_fits([*prior, 2.0 / mid], cap, delta) else (lo, mid)
    return lo


@pytest.mark.parametrize("prior", [[], [8.0], [6.0, 9.0]])
def test_the_search_lands_within_one_bracket_step_below_the_boundary(prior):
    history = [GaussianQuery(s) for s in prior]
    target, rounds = 10.0, 8
    found = largest_target(history, toy_events, target, CAP, DELTA, rounds=rounds, decimals=None)
    boundary = reference(prior, CAP, DELTA, target)
    assert found is not None
    assert gaussian_fits([*prior, 2.0 / found], CAP, DELTA)
    assert admits(history, toy_events(found), CAP, DELTA)
    assert 0 <= boundary - found <= (target - spent(history, DELTA)) / 2**rounds + 1e-12


def test_more_rounds_come_closer():
    boundary = reference([], CAP, DELTA, 10.0)
    coarse = largest_target([], toy_events, 10.0, CAP, DELTA, rounds=4, decimals=None)
    fine = largest_target([], toy_events, 10.0, CAP, DELTA, rounds=20, decimals=None)
    assert coarse is not None and fine is not None
    assert coarse <= fine <= boundary
    assert boundary - fine <= 10.0 / 2**20


def test_rounded_down_to_two_decimals():
    exact = largest_target([], toy_events, 10.0, CAP, DELTA, decimals=None)
    rounded = largest_target([], toy_events, 10.0, CAP, DELTA)
    assert exact is not None and rounded == math.floor(exact * 100) / 100


def test_a_target_without_a_plan_does_not_fit():
    """Targets the function cannot plan (None) count as refused, like a calibration that fails."""
    boundary = reference([], CAP, DELTA, 10.0)

    def planned_above_half(target: float) -> list[GaussianQuery] | None:
        return toy_events(target) if target > 0.5 else None

    found = largest_target([], planned_above_half, 10.0, CAP, DELTA, decimals=None)
    assert found is not None and 0.5 < found <= boundary


def test_nothing_fits_after_a_history_that_fills_the_cap():
    history = [GaussianQuery(1.0)]  # alone beyond a cap of 3 (epsilon 4.7)
    assert not gaussian_fits([1.0], CAP, DELTA)
    calls = []
    found = largest_target(
        history, toy_events, 12.0, CAP, DELTA, progress=lambda d, t: calls.append((d, t))
    )
    assert found is None
    assert calls == [(i, 8) for i in range(9)]  # one step per plan, and the start
