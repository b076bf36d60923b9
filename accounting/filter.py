"""The dataset cap as a privacy filter, and the odometer, under fully adaptive composition.

Releases from one dataset are planned one after another, each chosen after seeing the earlier ones,
so both the mechanisms and their privacy parameters are adaptive. Composing their RDP curves and
checking "epsilon of the composed curve <= cap" is the non-adaptive composition theorem; with
adaptively chosen parameters the stopping rule must itself be a *privacy filter*.

Theorem (multi-order RDP filter; Lécuyer 2021, "Practical Privacy Filters and Odometers with Rényi
Differential Privacy and Applications to Differentially Private Deep Learning", arXiv:2103.01379,
built on the single-order Rényi filter of Feldman & Zrnic 2021, "Individual Privacy Accounting via a
Rényi Filter", NeurIPS 2021, Thm. 3.1). Fix a finite set of orders Λ and a budget (ε, δ) before the
first release, and let B(α) = ε - log(1/δ)/(α - 1). Mechanisms M_1, M_2, ... are chosen adaptively;
M_i is (α, ρ_i(α))-RDP at every α in Λ, and ρ_i is known before M_i runs. If the interaction runs
M_i only while some order still satisfies Σ_{j<=i} ρ_j(α) <= B(α), the whole interaction (with its
data-dependent length) is (ε, δ)-DP.

Conditions as the ledger meets them: Λ is RDP_ORDERS, a constant of the code; ρ_i is the RDP curve of
the events a run *reserves* before it reads data, checked in the reservation's transaction; what a
run executes never exceeds what it reserved, order by order (ledger.commit checks it). The
conversion covered is Mironov's (2017, Prop. 3), eps = ρ(α) + log(1/δ)/(α - 1), not the tighter
one dp-accounting reports (Canonne-Kamath-Steinke 2020): the stop rule uses the covered conversion,
while the reported epsilon (a fixed-sequence figure) keeps dp-accounting's.

The odometer (Lécuyer 2021 §4; Rogers et al. 2016) answers "what has been spent so far", valid at
every time at once: filters for a geometric grid of budgets ε_k, fixed in advance, each at δ/K; the
smallest ε_k whose filter would still accept the history bounds the spend, simultaneously over time.
"""
from __future__ import annotations

import math

import numpy as np

from accounting.epsilon import RDP_ORDERS

ORDERS = np.asarray(RDP_ORDERS, dtype=np.float64)
# Absolute slack on RDP(α) <= B(α): a sum of 10,000 doubles drifts ~1e-12; a real overshoot is far larger.
TOLERANCE = 1e-9
# Odometer grid: ε_k = ODOMETER_MIN * ODOMETER_RATIO**k, k < ODOMETER_STEPS (0.01 .. ~1100), each at δ/K.
ODOMETER_MIN, ODOMETER_RATIO, ODOMETER_STEPS = 0.01, 2 ** 0.25, 68


def order_budgets(epsilon: float, delta: float) -> np.ndarray:
    """B(α) = ε - log(1/δ)/(α - 1) at every order of the filter (negative: that order cannot admit)."""
    return epsilon - math.log(1.0 / delta) / (ORDERS - 1.0)


def filter_epsilon(rdp: np.ndarray, delta: float) -> float:
    """The smallest budget ε whose filter still admits this running curve: min over α of
    ρ(α) + log(1/δ)/(α - 1). The filter with cap ε admits the curve iff this is <= ε (0 when nothing ran)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    if not np.any(rdp != 0):
        return 0.0
    with np.errstate(invalid="ignore"):
        values = rdp + math.log(1.0 / delta) / (ORDERS - 1.0)
    values = np.where(np.isnan(values), np.inf, values)
    return max(0.0, float(np.min(values)))


def admits(rdp: np.ndarray, epsilon: float, delta: float) -> bool:
    """The stop rule: continue iff some order α has running RDP(α) <= B(α) (within float tolerance)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    return bool(np.any(rdp <= order_budgets(epsilon, delta) + TOLERANCE))


def odometer_grid() -> np.ndarray:
    return ODOMETER_MIN * ODOMETER_RATIO ** np.arange(ODOMETER_STEPS)


def odometer(rdp: np.ndarray, delta: float) -> float:
    """Spend so far valid at any time: the smallest grid budget ε_k whose filter (at δ/K) admits the
    curve; 0 for an empty history, inf past the grid's top."""
    rdp = np.asarray(rdp, dtype=np.float64)
    if not np.any(rdp > 0):
        return 0.0
    need = filter_epsilon(rdp, delta / ODOMETER_STEPS)
    grid = odometer_grid()
    fits = grid[grid + TOLERANCE >= need]
    return float(fits[0]) if fits.size else math.inf
