"""Epsilon lower bound from one training run (Steinke, Nasr & Jagielski, "Privacy Auditing with One
(1) Training Run", NeurIPS 2023, arXiv:2305.08846).

m canaries are each included in the training set independently with probability 1/2. After training
the auditor ranks the canaries by a score, guesses "included" for the k+ highest, "excluded" for the
k- lowest and abstains on the rest. Theorem 5.2 of the paper: if training is (eps, delta)-DP, the
number of correct guesses V among r = k+ + k- guesses satisfies, for every v,

    P[V >= v] <= P[Binomial(r, p) >= v] + 2 m delta * max_{i in 1..v} P[v > Binomial(r, p) >= v - i]
    / i,

with p = e^eps / (1 + e^eps) (the accuracy of eps-DP randomised response; this is the computation of
the paper's Algorithm 2 / its code listing in the appendix). The epsilon lower bound is the largest
eps whose p-value is below 1 - confidence. The guess counts are fixed before looking at the scores
and the level is split over them (Bonferroni), so reporting the best of them keeps the confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from accounting.errors import InvalidParameterError

# of m, guesses on each side = fraction * m / 2
DEFAULT_GUESS_FRACTIONS = (
    0.02,
    0.05,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
)


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[>= v correct of r guesses] under (eps, delta)-DP with m randomised canaries (Theorem
    5.2)."""
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, p))
    if v <= 0 or delta == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    cumulative = np.cumsum(stats.binom.pmf(v - i, r, p))  # P[v > Binomial(r, p) >= v - i]
    return min(tail + 2 * m * delta * float(np.max(cumulative / i)), 1.0)


def epsilon_from_guesses(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """Largest eps (bisection to 1e-6) such that v correct of r guesses has p-value < alpha; 0 if
    none."""
    if not 0 <= v <= r <= m:
        raise InvalidParameterError(f"need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m}).")
    if p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < alpha:
        lo, hi = hi, hi * 2
        if hi > 1e3:
            return math.inf
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < alpha else (lo, mid)
    return lo


@dataclass(frozen=True)
class OneRunBound:
    eps_lower: float  # valid at `confidence` over the canary randomisation and the training noise
    guesses: int  # r of the best pre-registered guess count
    correct: int  # v at that count
    m: int  # canaries
    confidence: float
    delta: float
    max_certifiable: (
        float  # the bound if every guess at the largest count were right: the audit's ceiling
    )
    per_count: tuple[tuple[int, int, float], ...]  # (r, v, eps) for every pre-registered count


def one_run_bound(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float = 0.95,
    guess_fractions: tuple[float, ...] = DEFAULT_GUESS_FRACTIONS,
) -> OneRunBound:
    """Higher score = "included". `included`: the canaries' true inclusion bits (the coin flips)."""
    s, inc = np.asarray(scores, np.float64), np.asarray(included, bool)
    m = len(s)
    if inc.shape != s.shape or m < 10:
        raise InvalidParameterError(
            "need one inclusion bit per score and at least 10 "
            f"canaries, got {m} scores and {inc.shape} bits."
        )
    if not np.isfinite(s).all():
        raise InvalidParameterError(
            "canary scores contain NaN or infinite values; check the trained model."
        )
    if not 0 < confidence < 1 or not 0 <= delta < 1:
        raise InvalidParameterError(
            f"confidence must be in (0, 1) and delta in [0, 1); got {confidence}, {delta}."
        )
    counts = sorted({max(1, int(f * m / 2)) for f in guess_fractions})
    alpha = (1 - confidence) / len(counts)
    # ties broken at random so equal scores (e.g. no noise at all) carry no hidden information
    order = np.lexsort((np.random.default_rng(0).random(m), -s))
    rows = []
    for k in counts:
        correct = int(inc[order[:k]].sum() + (~inc[order[-k:]]).sum())
        rows.append((2 * k, correct, epsilon_from_guesses(m, 2 * k, correct, delta, alpha)))
    best = max(rows, key=lambda row: row[2])
    ceiling = epsilon_from_guesses(m, 2 * counts[-1], 2 * counts[-1], delta, alpha)
    return OneRunBound(best[2], best[0], best[1], m, confidence, float(delta), ceiling, tuple(rows))


def ceiling(
    m: int,
    delta: float,
    confidence: float = 0.95,
    guess_fractions: tuple[float, ...] = DEFAULT_GUESS_FRACTIONS,
) -> float:
    """The most one_run_bound can certify with m canaries: every guess at the largest count
    right."""
    counts = sorted({max(1, int(f * m / 2)) for f in guess_fractions})
    return epsilon_from_guesses(
        m, 2 * counts[-1], 2 * counts[-1], delta, (1 - confidence) / len(counts)
    )


def ceiling_search(
    eps: float, delta: float, confidence: float = 0.95, most: int = 256_000
) -> tuple[int | None, float]:
    """(smallest canary count, 1,000 x a power of 2 up to `most`, whose ceiling exceeds eps, or
    None; the highest ceiling seen). The 2 m delta term of Theorem 5.2 grows with m, so the ceiling
    peaks (about 6.1 at m = 4,000 for delta = 1e-5) and then falls; the search stops there."""
    m, peak = 1000, -math.inf
    while m <= most:
        c = ceiling(m, delta, confidence)
        if c > eps:
            return m, c
        if c < peak:
            return None, peak
        m, peak = 2 * m, c
    return None, peak
