"""Membership inference on a released generator: loss-threshold attack on the diffusion loss.

Members are training (sensitive) images, non-members held-out images of the same distribution,
equally many of each. Score = -loss (a model fits its training images better). Reported: ROC AUC,
TPR at 1% and 0.1% FPR, and an empirical epsilon lower bound compared with the claimed epsilon."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from accounting.errors import InvalidParameterError
from audit.epsilon_bound import epsilon_lower_bound
from audit.images import sample_idx
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset

LossFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Highest TPR whose FPR does not exceed `target` (no interpolation: conservative)."""
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def attack_stats(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> dict:
    y = np.r_[np.ones(len(member_scores)), np.zeros(len(nonmember_scores))]
    s = np.r_[member_scores, nonmember_scores]
    fpr, tpr, _ = roc_curve(y, s)
    return {
        "auc": float(roc_auc_score(y, s)),
        "tpr_at_1pct_fpr": tpr_at_fpr(fpr, tpr, 0.01),
        "tpr_at_01pct_fpr": tpr_at_fpr(fpr, tpr, 0.001),
        "fpr": fpr,
        "tpr": tpr,
    }


def _losses(loss_fn: LossFn, data: ImageDataset) -> np.ndarray:
    losses = np.asarray(loss_fn(data.images, data.labels), dtype=np.float64).reshape(-1)
    if losses.shape != (len(data),):
        raise InvalidParameterError(
            f"loss_fn returned {losses.shape[0]} losses for "
            f"{len(data)} images; it must return one loss per image."
        )
    if not np.isfinite(losses).all():
        raise InvalidParameterError(
            "loss_fn returned NaN or infinite losses; check the generator checkpoint."
        )
    return losses


def plot_roc(stats: dict, path: Path, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, log in zip(axes, (False, True), strict=True):
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


def calibrated_scores(target: np.ndarray, references: np.ndarray) -> np.ndarray:
    """Per-example calibrated membership score (higher = member) from the target model's losses and
    reference models' losses on the same examples (references never trained on them: a model trained
    on public data only, or on a held-out half). One reference: the loss difference (difficulty
    calibration, Watson et al. ICLR 2022). Several: offline LiRA (Carlini et al. S&P 2022), the
    z-score of the target loss under each example's Gaussian of reference losses, with the variance
    pooled over examples when there are few references (as LiRA does below ~64 models)."""
    refs = np.atleast_2d(np.asarray(references, np.float64))
    if refs.shape[1] != len(target):
        raise InvalidParameterError(
            f"reference losses have shape {refs.shape}; give one row per reference model and one "
            f"column per example ({len(target)})."
        )
    if len(refs) == 1:
        return refs[0] - target
    mu = refs.mean(0)
    sd = np.sqrt(np.mean(refs.var(0, ddof=1))) if len(refs) < 8 else refs.std(0, ddof=1)
    return (mu - target) / np.maximum(sd, 1e-12)


def tpr_interval(
    member_scores: np.ndarray, nonmember_scores: np.ndarray, fpr: float, confidence: float
) -> dict:
    """TPR at the largest threshold whose FPR <= `fpr`, with a two-sided Clopper-Pearson
    interval."""
    from audit.epsilon_bound import clopper_pearson

    non = np.sort(nonmember_scores)[::-1]
    allowed = int(np.floor(fpr * len(non) + 1e-9))  # false positives allowed
    threshold = non[allowed] if allowed < len(non) else -np.inf  # strictly above: <= allowed FPs
    tp = int(np.sum(member_scores > threshold))
    lo, hi = clopper_pearson(np.array([tp]), len(member_scores), (1 - confidence) / 2)
    return {
        "tpr": tp / len(member_scores),
        "ci": [float(lo[0]), float(hi[0])],
        "fpr_target": fpr,
        "fpr_resolution": 1.0 / len(non),
        "true_positives": tp,
    }


@dataclass(frozen=True)
class MiaNumbers:
    """compute_mia's numbers: the raw loss attack and, with reference models, the calibrated one."""

    n: int
    # "loss" | "calibrated" -> auc, tpr intervals at 1% / 0.1%, epsilon bound, roc
    attacks: dict[str, dict]

    @property
    def strongest(self) -> str:
        return max(
            self.attacks,
            key=lambda k: (self.attacks[k]["epsilon_bound"]["eps_lower"], self.attacks[k]["auc"]),
        )


def compute_mia(
    loss_fn: LossFn,
    members: ImageDataset,
    nonmembers: ImageDataset,
    delta: float | None,
    policy: AuditPolicy,
    reference_loss_fns: list[LossFn] | None = None,
) -> MiaNumbers:
    """Loss-threshold attack and, given reference models, its per-example calibrated version."""
    rng = np.random.default_rng(policy.seed)
    n = min(policy.mia_samples, len(members), len(nonmembers))
    mem = members.subset(sample_idx(len(members), n, rng))
    non = nonmembers.subset(sample_idx(len(nonmembers), n, rng))
    lm, ln = _losses(loss_fn, mem), _losses(loss_fn, non)
    scores = {"loss": (-lm, -ln)}
    if reference_loss_fns:
        rm = np.stack([_losses(f, mem) for f in reference_loss_fns])
        rn = np.stack([_losses(f, non) for f in reference_loss_fns])
        scores["calibrated"] = (calibrated_scores(lm, rm), calibrated_scores(ln, rn))
    attacks = {}
    for name, (ms, ns) in scores.items():
        stats = attack_stats(ms, ns)
        attacks[name] = {
            "auc": stats["auc"],
            "tpr_at_1pct_fpr": stats["tpr_at_1pct_fpr"],
            "tpr_at_01pct_fpr": stats["tpr_at_01pct_fpr"],
            "tpr_1pct": tpr_interval(ms, ns, 0.01, policy.mia_confidence),
            "tpr_01pct": tpr_interval(ms, ns, 0.001, policy.mia_confidence),
            "epsilon_bound": epsilon_lower_bound(
                ms, ns, delta if delta is not None else 0.0, policy.mia_confidence, seed=policy.seed
            ),
            "roc": {"fpr": stats["fpr"], "tpr": stats["tpr"]},
        }
    return MiaNumbers(n, attacks)


def check_mia(
    numbers: MiaNumbers,
    claimed_epsilon: float | None,
    policy: AuditPolicy,
    artifacts_dir: Path | None,
) -> CheckResult:
    """Verdict on the strongest attack: AUC, TPR@1%FPR (and 0.1% if set) and the epsilon bound vs
    the claim."""
    name = numbers.strongest
    a = numbers.attacks[name]
    bound, n = a["epsilon_bound"], numbers.n
    contradiction = claimed_epsilon is not None and bound["eps_lower"] > claimed_epsilon
    checks = {
        "auc": a["auc"] <= policy.mia_max_auc,
        "tpr_at_1pct_fpr": a["tpr_at_1pct_fpr"] <= policy.mia_max_tpr_at_1pct_fpr,
        "epsilon_consistent": not contradiction,
    }
    if policy.mia_max_tpr_at_01pct_fpr is not None:
        checks["tpr_at_01pct_fpr"] = a["tpr_at_01pct_fpr"] <= policy.mia_max_tpr_at_01pct_fpr
    artifacts = {}
    if artifacts_dir is not None:
        artifacts["roc_curve"] = plot_roc(
            {"auc": a["auc"], **a["roc"]},
            Path(artifacts_dir) / "mia_roc.png",
            f"{name} MIA ({n} members vs {n} held-out)",
        )
    summary = _mia_summary(numbers, policy, claimed_epsilon, contradiction)
    attacks = {
        k: {kk: vv for kk, vv in v.items() if kk != "roc"} for k, v in numbers.attacks.items()
    }
    details = {
        "n_members": n,
        "n_nonmembers": n,
        "attack": name,
        "auc": a["auc"],
        "tpr_at_1pct_fpr": a["tpr_at_1pct_fpr"],
        "tpr_at_01pct_fpr": a["tpr_at_01pct_fpr"],
        "epsilon_bound": bound,
        "attacks": attacks,
        "claimed_epsilon": claimed_epsilon,
        "contradiction": contradiction,
        "checks": checks,
        "fpr_resolution": 1.0 / n,
        "note": (
            "Empirical bound treats each member/non-member as an independent trial (many-canary "
            "heuristic); it is a lower bound on leakage, not a proof of privacy. Reported: the "
            "strongest attack by its epsilon bound."
        ),
    }
    return CheckResult(
        "membership_inference", "attack", all(checks.values()), summary, details, artifacts
    )


def _mia_summary(
    numbers: MiaNumbers, policy: AuditPolicy, claimed_epsilon: float | None, contradiction: bool
) -> str:
    """The verdict's line: the strongest attack's AUC, TPRs with their intervals, and its epsilon
    bound against the claim."""
    name = numbers.strongest
    a = numbers.attacks[name]
    bound = a["epsilon_bound"]
    eps_txt = f"{claimed_epsilon:.3g}" if claimed_epsilon is not None else "none claimed"
    ci1, ci01 = a["tpr_1pct"]["ci"], a["tpr_01pct"]["ci"]
    return (
        f"{name} attack: AUC {a['auc']:.3f} (max {policy.mia_max_auc}), TPR@1%FPR "
        f"{a['tpr_at_1pct_fpr']:.3f} [{ci1[0]:.3f}, {ci1[1]:.3f}] (max "
        f"{policy.mia_max_tpr_at_1pct_fpr}), TPR@0.1%FPR {a['tpr_at_01pct_fpr']:.3f} "
        f"[{ci01[0]:.3f}, {ci01[1]:.3f}]; empirical eps >= {bound['eps_lower']:.3f} "
        f"({policy.mia_confidence:.0%} CP) vs claimed {eps_txt}"
        + (" — CONTRADICTS the claimed epsilon" if contradiction else "")
        + (
            ""
            if "calibrated" in numbers.attacks
            else "; no reference models: uncalibrated loss attack only"
        )
    )


def run_mia(
    loss_fn: LossFn,
    members: ImageDataset,
    nonmembers: ImageDataset,
    claimed_epsilon: float | None,
    delta: float | None,
    policy: AuditPolicy,
    artifacts_dir: Path | None,
    reference_loss_fns: list[LossFn] | None = None,
) -> CheckResult:
    return check_mia(
        compute_mia(loss_fn, members, nonmembers, delta, policy, reference_loss_fns),
        claimed_epsilon,
        policy,
        artifacts_dir,
    )
