"""The dataset cap as a privacy filter, and the odometer, under fully adaptive composition.

Releases from one dataset are planned one after another, each chosen after seeing the earlier ones,
so both the mechanisms and their privacy parameters are adaptive. Composing their RDP curves and
checking "epsilon of the composed curve <= cap" is the non-adaptive composition theorem; with
adaptively chosen parameters the stopping rule must itself be a *privacy filter*.

Theorem (multi-order RDP filter: Lécuyer 2021, "Practical Privacy Filters and Odometers with
Rényi Differential Privacy and Applications to Differentially Private Deep Learning",
arXiv:2103.01379, on the single-order Rényi filter of Feldman & Zrnic 2021, "Individual
Privacy Accounting via a Rényi Filter", NeurIPS 2021, Thm 3.1). Fix (ε, δ) and a finite set of
orders Λ with Σ_{α∈Λ} g(α) <= 1, where g(α) = (α-1)^(α-1) / α^α, and let B(α) = ε -
log(1/δ)/(α - 1). Mechanisms M_1, M_2, ... are chosen adaptively; M_i is (α, ρ_i(α))-RDP at
every α in Λ, with ρ_i known before M_i runs. If M_i runs only while some α in Λ keeps
Σ_{j<=i} ρ_j(α) <= B(α) (otherwise it is refused and the analyst may go on), the whole
interaction, with its data-dependent length and parameters, is (ε, δ)-DP.
Proof. (1) For one order α, the interaction filtered at α alone is (α, B(α))-RDP (Feldman &
Zrnic). (2) Split the outcomes by the smallest order alive at the end; on the part S_α the
real interaction runs and refuses exactly what the α-filtered one does, so both give S_α the
same probability, under D and D'. (3) Hölder (Mironov 2017, Prop. 10): P(S_α) <= (e^B(α)
Q(S_α))^(1-1/α) <= e^ε Q(S_α) + δ g(α), the second step maximising over Q(S_α). (4) Summing
over α: P(S) <= e^ε Q(S) + δ Σ g(α) <= e^ε Q(S) + δ. The condition on Λ is what pays for
choosing the order after the fact: over dp-accounting's 156 orders Σ g is about 9, so the
filter uses the 23 orders of FILTER_ORDERS (2 .. 1024, Σ g = 0.975); on DP-SGD this admits
within 3% of the steps the same rule would admit over all 156 orders. B(α) is Mironov's
conversion (2017, Prop. 3), which equals dp-accounting's tighter one (Canonne-Kamath-Steinke
2020) at δ·g(α): the stop rule uses it, while the reported epsilon keeps dp-accounting's over
all orders (a fixed-sequence figure).

Conditions as the ledger meets them: FILTER_ORDERS is a constant of the code; ρ_i is the RDP curve
of the events a run *reserves* before it reads data, checked in the reservation's transaction; what
a run executes never exceeds what it reserved, order by order (ledger.commit checks it).

The odometer answers "what has been spent so far", valid at every time at once (Rogers et al. 2016;
Lécuyer 2021 §4; Whitehouse et al. 2023): for the grid ε_k = 0.01·2^(k/4), k < K = 68, fixed in
advance, it reports the smallest ε_k such that some α in Λ has ρ(α) <= ε_k - log(K·|Λ|/δ)/(α - 1).
Then P(at some time the privacy loss exceeds the reported value) <= δ: exp((α-1)(L_t - Σρ(α))) is a
supermartingale for each α (Feldman & Zrnic), Ville's inequality bounds each of the K·|Λ| events
"loss > ε_k while order α is within its ε_k budget" by δ/(K·|Λ|), and a union bound adds them.
"""

from __future__ import annotations

import math

import numpy as np

from accounting.epsilon import RDP_ORDERS

FILTER_ORDERS: tuple[float, ...] = (
    2.0,
    3.0,
    4.0,
    5.0,
    6.0,
    7.0,
    8.0,
    10.0,
    12.0,
    14.0,
    16.0,
    20.0,
    24.0,
    28.0,
    32.0,
    40.0,
    48.0,
    56.0,
    63.0,
    128.0,
    256.0,
    512.0,
    1024.0,
)
ORDERS = np.asarray(FILTER_ORDERS, dtype=np.float64)
_INDEX = np.asarray([RDP_ORDERS.index(a) for a in FILTER_ORDERS])  # positions in the running curve


def slack(alpha: float) -> float:
    """g(α) = (α-1)^(α-1) / α^α: the share of δ one order may use (see the theorem above)."""
    return math.exp((alpha - 1) * math.log(alpha - 1) - alpha * math.log(alpha))


assert sum(slack(a) for a in FILTER_ORDERS) <= 1.0  # the theorem's condition on the grid
# Absolute slack on RDP(α) <= B(α): a sum of 10,000 doubles drifts ~1e-12; a real overshoot is far
# larger.
TOLERANCE = 1e-9
# Odometer grid: ε_k = ODOMETER_MIN * ODOMETER_RATIO**k, k < ODOMETER_STEPS (0.01 .. ~1100).
ODOMETER_MIN, ODOMETER_RATIO, ODOMETER_STEPS = 0.01, 2**0.25, 68


def order_budgets(epsilon: float, delta: float) -> np.ndarray:
    """B(α) = ε - log(1/δ)/(α - 1) at every order of the filter (negative: that order cannot
    admit)."""
    return epsilon - math.log(1.0 / delta) / (ORDERS - 1.0)


def _on_grid(rdp: np.ndarray) -> np.ndarray:
    """The running curve (over RDP_ORDERS) at the filter's orders."""
    return np.asarray(rdp, dtype=np.float64)[_INDEX]


def filter_epsilon(rdp: np.ndarray, delta: float) -> float:
    """The smallest budget ε whose filter still admits this running curve (given over RDP_ORDERS):
    min over α in FILTER_ORDERS of ρ(α) + log(1/δ)/(α - 1). The filter with cap ε admits it iff this
    is <= ε (0 when nothing ran)."""
    rdp = _on_grid(rdp)
    if not np.any(rdp != 0):
        return 0.0
    with np.errstate(invalid="ignore"):
        values = rdp + math.log(1.0 / delta) / (ORDERS - 1.0)
    values = np.where(np.isnan(values), np.inf, values)
    return max(0.0, float(np.min(values)))


def admits(rdp: np.ndarray, epsilon: float, delta: float) -> bool:
    """The stop rule: continue iff some order α of the filter has running RDP(α) <= B(α) (within
    float tolerance). `rdp` is the running curve over RDP_ORDERS."""
    rdp = _on_grid(rdp)
    return bool(np.any(rdp <= order_budgets(epsilon, delta) + TOLERANCE))


def odometer_delta(delta: float) -> float:
    """The share of δ each (grid budget, order) pair of the odometer gets: δ / (K·|Λ|)."""
    return delta / (ODOMETER_STEPS * len(FILTER_ORDERS))


def cap_check(rdp: np.ndarray, epsilon: float, delta: float) -> tuple[bool, float]:
    """(would the cap's filter admit this running curve, the filter's epsilon): what a what-if
    reports."""
    return admits(rdp, epsilon, delta), filter_epsilon(rdp, delta)


def odometer_grid() -> np.ndarray:
    return ODOMETER_MIN * ODOMETER_RATIO ** np.arange(ODOMETER_STEPS)


def odometer(rdp: np.ndarray, delta: float) -> float:
    """Spend so far, valid at every time at once: the smallest grid budget ε_k with some order α
    having ρ(α) <= ε_k - log(K·|Λ|/δ)/(α - 1); 0 for an empty history, inf past the grid's top."""
    if not np.any(_on_grid(rdp) > 0):
        return 0.0
    need = filter_epsilon(rdp, odometer_delta(delta))
    grid = odometer_grid()
    fits = grid[grid + TOLERANCE >= need]
    return float(fits[0]) if fits.size else math.inf
