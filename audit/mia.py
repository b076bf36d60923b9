"""Membership inference on a released generator: loss-threshold attack on the diffusion loss.

Members are training (sensitive) images, non-members held-out images of the same distribution,
equally many of each. Score = -loss (a model fits its training images better). Reported: ROC AUC,
TPR at 1% and 0.1% FPR, and an empirical epsilon lower bound compared with the claimed epsilon."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from accounting.errors import InvalidParameterError
from audit.epsilon_bound import epsilon_lower_bound
from audit.images import sample_idx
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.datasets import ImageDataset

LossFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Highest TPR whose FPR does not exceed `target` (no interpolation: conservative)."""
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def attack_stats(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> dict:
    y = np.r_[np.ones(len(member_scores)), np.zeros(len(nonmember_scores))]
    s = np.r_[member_scores, nonmember_scores]
    fpr, tpr, _ = roc_curve(y, s)
    return {"auc": float(roc_auc_score(y, s)), "tpr_at_1pct_fpr": tpr_at_fpr(fpr, tpr, 0.01),
            "tpr_at_01pct_fpr": tpr_at_fpr(fpr, tpr, 0.001), "fpr": fpr, "tpr": tpr}


def _losses(loss_fn: LossFn, data: ImageDataset) -> np.ndarray:
    losses = np.asarray(loss_fn(data.images, data.labels), dtype=np.float64).reshape(-1)
    if losses.shape != (len(data),):
        raise InvalidParameterError(f"loss_fn returned {losses.shape[0]} losses for {len(data)} images; "
                                    "it must return one loss per image.")
    if not np.isfinite(losses).all():
        raise InvalidParameterError("loss_fn returned NaN or infinite losses; check the generator checkpoint.")
    return losses


def plot_roc(stats: dict, path: Path, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, log in zip(axes, (False, True)):
        ax.plot(stats["fpr"], stats["tpr"], label=f"attack (AUC {stats['auc']:.3f})")
        ax.plot([1e-4, 1], [1e-4, 1], "k--", lw=0.8, label="chance")
        if log:
            ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlim(1e-3, 1), ax.set_ylim(1e-3, 1)
        ax.set_xlabel("false positive rate"), ax.set_ylabel("true positive rate")
        ax.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)


def run_mia(loss_fn: LossFn, members: ImageDataset, nonmembers: ImageDataset, claimed_epsilon: float | None,
            delta: float | None, policy: AuditPolicy, artifacts_dir: Path | None) -> CheckResult:
    rng = np.random.default_rng(policy.seed)
    n = min(policy.mia_samples, len(members), len(nonmembers))
    mem = members.subset(sample_idx(len(members), n, rng))
    non = nonmembers.subset(sample_idx(len(nonmembers), n, rng))
    ms, ns = -_losses(loss_fn, mem), -_losses(loss_fn, non)
    stats = attack_stats(ms, ns)
    bound = epsilon_lower_bound(ms, ns, delta if delta is not None else 0.0, policy.mia_confidence, seed=policy.seed)
    contradiction = claimed_epsilon is not None and bound["eps_lower"] > claimed_epsilon
    checks = {"auc": stats["auc"] <= policy.mia_max_auc,
              "tpr_at_1pct_fpr": stats["tpr_at_1pct_fpr"] <= policy.mia_max_tpr_at_1pct_fpr,
              "epsilon_consistent": not contradiction}
    if policy.mia_max_tpr_at_01pct_fpr is not None:
        checks["tpr_at_01pct_fpr"] = stats["tpr_at_01pct_fpr"] <= policy.mia_max_tpr_at_01pct_fpr
    artifacts = {}
    if artifacts_dir is not None:
        artifacts["roc_curve"] = plot_roc(stats, Path(artifacts_dir) / "mia_roc.png",
                                          f"Loss-threshold MIA ({n} members vs {n} held-out)")
    eps_txt = f"{claimed_epsilon:.3g}" if claimed_epsilon is not None else "none claimed"
    summary = (f"AUC {stats['auc']:.3f} (max {policy.mia_max_auc}), TPR@1%FPR {stats['tpr_at_1pct_fpr']:.3f} "
               f"(max {policy.mia_max_tpr_at_1pct_fpr}), TPR@0.1%FPR {stats['tpr_at_01pct_fpr']:.3f}; "
               f"empirical eps >= {bound['eps_lower']:.3f} ({policy.mia_confidence:.0%} CP) vs claimed {eps_txt}"
               + (" — CONTRADICTS the claimed epsilon" if contradiction else ""))
    details = {"n_members": n, "n_nonmembers": n, "auc": stats["auc"], "tpr_at_1pct_fpr": stats["tpr_at_1pct_fpr"],
               "tpr_at_01pct_fpr": stats["tpr_at_01pct_fpr"], "epsilon_bound": bound,
               "claimed_epsilon": claimed_epsilon, "contradiction": contradiction, "checks": checks,
               "fpr_resolution": 1.0 / n,
               "note": "Empirical bound treats each member/non-member as an independent trial (many-canary "
                       "heuristic); it is a lower bound on leakage, not a proof of privacy."}
    return CheckResult("membership_inference", "attack", all(checks.values()), summary, details, artifacts)
