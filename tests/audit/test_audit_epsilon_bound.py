"""The empirical epsilon lower bound never exceeds a known true epsilon, yet detects strong leakage."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from accounting.errors import InvalidParameterError
from audit.epsilon_bound import clopper_pearson, epsilon_lower_bound


def gaussian_true_epsilon(sigma: float, delta: float) -> float:
    """Exact epsilon(delta) of the Gaussian mechanism, sensitivity 1 (Balle & Wang 2018)."""
    f = lambda e: (
        norm.cdf(-e * sigma + 1 / (2 * sigma))
        - math.exp(e) * norm.cdf(-e * sigma - 1 / (2 * sigma))
        - delta
    )
    return brentq(f, 0.0, 200.0)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_bound_never_exceeds_gaussian_mechanism_epsilon(sigma):
    delta = 1e-5
    true_eps = gaussian_true_epsilon(sigma, delta)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma))
    assert acc.get_epsilon(delta) == pytest.approx(
        true_eps, rel=1e-3
    )  # our "known epsilon" agrees with dp-accounting
    bounds = []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        # optimal attack scores: the mechanism's output on D (mean 1) vs on the neighbour D' (mean 0)
        members, nonmembers = (
            1 + sigma * rng.standard_normal(2000),
            sigma * rng.standard_normal(2000),
        )
        bounds.append(epsilon_lower_bound(members, nonmembers, delta, seed=seed)["eps_lower"])
    assert max(bounds) <= true_eps
    assert np.mean(bounds) > 0.1 * true_eps  # and it is not vacuous


def test_randomized_response_coverage_at_confidence():
    """Randomized response has exactly the claimed epsilon; the bound may exceed it only with
    probability <= 1 - confidence."""
    for eps in (0.5, 1.0, 2.0):
        p = math.exp(eps) / (1 + math.exp(eps))
        violations = 0
        for seed in range(100):
            rng = np.random.default_rng(1000 + seed)
            m = (rng.random(1000) < p).astype(float)
            n = (rng.random(1000) < 1 - p).astype(float)
            violations += (
                epsilon_lower_bound(m, n, 0.0, confidence=0.95, seed=seed)["eps_lower"] > eps
            )
        assert violations <= 5


def test_no_signal_gives_zero_and_perfect_signal_gives_large_bound():
    rng = np.random.default_rng(0)
    same = epsilon_lower_bound(rng.normal(size=500), rng.normal(size=500), 1e-5)
    assert same["eps_lower"] < 0.3
    sep = epsilon_lower_bound(rng.normal(10, 1, 500), rng.normal(0, 1, 500), 1e-5)
    assert sep["eps_lower"] > 3.0 and sep["eps_lower"] <= sep["eps_point"] <= sep["eps_upper"]


def test_clopper_pearson_contains_rate():
    lo, hi = clopper_pearson(np.array([0, 5, 10]), 10, 0.025)
    assert lo[0] == 0 and hi[2] == 1 and lo[1] < 0.5 < hi[1]


@pytest.mark.parametrize("kwargs", [{"delta": float("nan")}, {"delta": 1.5}, {"confidence": 1.0}])
def test_bad_parameters_raise(kwargs):
    args = {"delta": 1e-5, "confidence": 0.95} | kwargs
    with pytest.raises(InvalidParameterError):
        epsilon_lower_bound(np.ones(10), np.zeros(10), args["delta"], args["confidence"])
    with pytest.raises(InvalidParameterError):
        epsilon_lower_bound(np.array([np.nan] * 10), np.zeros(10), 1e-5)
