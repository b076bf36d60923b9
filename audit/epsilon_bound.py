"""Empirical epsilon lower bound from a membership test (Jagielski et al. 2020; Nasr et al. 2021).

(eps, delta)-DP implies, for the rejection region S = {score >= t}: TPR <= e^eps * FPR + delta and
(complement) TNR <= e^eps * FNR + delta. With Clopper-Pearson bounds (TPR_lo, FPR_hi), each
one-sided at (1 - confidence) / 2, eps >= max(log((TPR_lo - delta) / FPR_hi), log((TNR_lo - delta) /
FNR_hi)) holds with probability >= confidence. Picking the best threshold on the same data would
void that guarantee, so the threshold is chosen on one random half and the bound is computed on the
other.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta

from accounting.errors import InvalidParameterError


def clopper_pearson(successes: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided (lower at alpha, upper at alpha) exact binomial bounds for success rates."""
    k = np.asarray(successes, dtype=np.float64)
    lo = np.where(k > 0, beta.ppf(alpha, np.maximum(k, 1e-12), n - k + 1), 0.0)
    hi = np.where(k < n, beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1e-12)), 1.0)
    return lo, hi


def _eps(tpr: np.ndarray, fpr: np.ndarray, delta: float) -> np.ndarray:
    """max over the two regions of log((TPR - delta) / FPR); 0 where nothing can be concluded."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(
            (tpr > delta) & (fpr > 0),
            np.log((tpr - delta) / fpr),
            np.where(tpr > delta, np.inf, 0.0),
        )
        tnr, fnr = 1 - fpr, 1 - tpr
        b = np.where(
            (tnr > delta) & (fnr > 0),
            np.log((tnr - delta) / fnr),
            np.where(tnr > delta, np.inf, 0.0),
        )
    return np.maximum(np.maximum(a, b), 0.0)


def _counts(
    members: np.ndarray, nonmembers: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    m, n = np.sort(members), np.sort(nonmembers)
    tp = len(m) - np.searchsorted(m, thresholds, side="left")
    fp = len(n) - np.searchsorted(n, thresholds, side="left")
    return tp, fp


def _bounds(tp, fp, n_m, n_n, delta, alpha) -> tuple[np.ndarray, np.ndarray]:
    tpr_lo, tpr_hi = clopper_pearson(tp, n_m, alpha / 2)
    fpr_lo, fpr_hi = clopper_pearson(fp, n_n, alpha / 2)
    # conservative (lower bound) and optimistic (upper end of the interval)
    return _eps(tpr_lo, fpr_hi, delta), _eps(tpr_hi, fpr_lo, delta)


def epsilon_lower_bound(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    delta: float,
    confidence: float = 0.95,
    seed: int = 0,
    max_thresholds: int = 256,
) -> dict:
    """Higher score = "member". Returns eps_lower (valid at `confidence`), eps_point, eps_upper (the
    Clopper-Pearson interval's other end at the chosen threshold), the threshold and its rates."""
    m, n = np.asarray(member_scores, np.float64), np.asarray(nonmember_scores, np.float64)
    if not (0 < confidence < 1):
        raise InvalidParameterError(f"confidence must be in (0, 1), got {confidence}.")
    if delta is None or not (0 <= delta < 1) or not math.isfinite(delta):
        raise InvalidParameterError(f"delta must be in [0, 1), got {delta}.")
    if len(m) < 4 or len(n) < 4:
        raise InvalidParameterError(
            "the epsilon lower bound needs at least 4 member and 4 non-member scores."
        )
    if not (np.isfinite(m).all() and np.isfinite(n).all()):
        raise InvalidParameterError(
            "attack scores contain NaN or infinite values; check the loss function."
        )
    alpha = 1 - confidence
    rng = np.random.default_rng(seed)
    pm, pn = rng.permutation(len(m)), rng.permutation(len(n))
    m_sel, m_ev = m[pm[: len(m) // 2]], m[pm[len(m) // 2 :]]
    n_sel, n_ev = n[pn[: len(n) // 2]], n[pn[len(n) // 2 :]]

    cands = np.unique(np.concatenate([m_sel, n_sel]))
    if len(cands) > max_thresholds:
        cands = np.unique(np.quantile(cands, np.linspace(0, 1, max_thresholds)))
    tp, fp = _counts(m_sel, n_sel, cands)
    lower_sel, _ = _bounds(tp, fp, len(m_sel), len(n_sel), delta, alpha)
    best = int(np.argmax(lower_sel))
    t = float(cands[best])

    tp, fp = _counts(m_ev, n_ev, np.array([t]))
    lower, upper = _bounds(tp, fp, len(m_ev), len(n_ev), delta, alpha)
    tpr, fpr = tp[0] / len(m_ev), fp[0] / len(n_ev)
    point = _eps(np.array([tpr]), np.array([fpr]), delta)[0]
    return {
        "eps_lower": float(lower[0]),
        "eps_point": float(point),
        "eps_upper": float(upper[0]),
        "threshold": t,
        "tpr": float(tpr),
        "fpr": float(fpr),
        "n_members_eval": len(m_ev),
        "n_nonmembers_eval": len(n_ev),
        "confidence": confidence,
        "delta": float(delta),
    }
