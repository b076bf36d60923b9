"""The reproduction's one-run audit of the DP-SGD implementation (audit.dpsgd_audit, Steinke, Nasr &
Jagielski 2023) at the PrivImage runs' DP-SGD settings for epsilon in AUDIT_EPSILONS, and with the noise
switched off (epsilon = infinity), with both canary scores (final model; every step's gradient).

The settings come from the same plan the charged runs execute (plan_privimage on MNIST-5k's 4,000
training images, semantic query included), so this section needs no diffusion training: seconds per
run. `python -m benchmarks.reproduce --only audit` re-runs just this section."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from audit.dpsgd_audit import SCORES

N_SENSITIVE = (
    4000  # builtin:mnist5k's training images: the record count the reproduction's runs plan with
)


def audit_settings(s: dict[str, Any]) -> list[tuple[float, Any]]:
    """(epsilon, DpSgdSetting) of the PrivImage (semantic selection) run at each audited epsilon."""
    from audit.dpsgd_audit import DpSgdSetting
    from benchmarks.reproduce_settings import privimage_config
    from synth.mechanisms.privimage.plan import plan_privimage

    out = []
    for eps in s["audit_epsilons"]:
        cfg = privimage_config(s, eps)
        plan = plan_privimage(cfg, N_SENSITIVE, n_classes=10)
        out.append(
            (
                eps,
                DpSgdSetting(
                    plan.sample_rate,
                    plan.noise_multiplier,
                    plan.steps,
                    cfg.max_grad_norm,
                    cfg.delta,
                    cfg.lr,
                    cfg.ema_decay,
                    f"PrivImage at epsilon {eps:g}",
                    cfg.dp_optimizer,
                    cfg.noise_multiplicity,
                ),
            )
        )
    return out


def _entry(eps: float, setting: Any, audits: dict[str, Any]) -> dict[str, Any]:
    first = next(iter(audits.values()))
    row: dict[str, Any] = {
        "epsilon": eps,
        "claimed_epsilon": first.claimed_epsilon if math.isfinite(eps) else math.inf,
        "sample_rate": setting.sample_rate,
        "noise_multiplier": setting.noise_multiplier,
        "steps": setting.steps,
        "canaries": first.bound.m,
        "max_certifiable": first.bound.max_certifiable,
        "scores": {},
    }
    for name, a in audits.items():
        run = a.run
        row["scores"][name] = {
            "eps_lower": a.bound.eps_lower,
            "correct": a.bound.correct,
            "guesses": a.bound.guesses,
            "gaussian_eps_lower": a.gaussian.eps_lower,
            "seconds": run.seconds,
            "scores_in": run.scores[run.included].tolist(),
            "scores_out": run.scores[~run.included].tolist(),
        }
    return row


def run(s: dict[str, Any]) -> dict[str, Any]:
    """One audit per (epsilon, score); epsilon = infinity: the largest epsilon's settings, noise off."""
    from audit.broken_dpsgd import no_noise
    from audit.dpsgd_audit import compute_implementation_audit
    from synth.kinds.datasets import public_pool

    t0 = time.time()
    public = public_pool()
    settings = audit_settings(s)
    rows = []
    for eps, setting in settings + [(math.inf, settings[-1][1])]:
        trainer = None if math.isfinite(eps) else no_noise
        audits = {
            score: compute_implementation_audit(
                setting,
                public,
                trainer=trainer,
                m=s["one_run_canaries"],
                seed=s["seed"],
                score=score,
            )
            for score in SCORES
        }
        rows.append(_entry(eps, setting, audits))
        text = ", ".join(f"{k} {v['eps_lower']:.2f}" for k, v in rows[-1]["scores"].items())
        print(
            f"[reproduce] one-run audit eps={eps:g}: bound {text} (ceiling {rows[-1]['max_certifiable']:.2f})",
            file=sys.stderr,
            flush=True,
        )
    return {
        "rows": rows,
        "public": public.source,
        "n_public": len(public),
        "seconds": time.time() - t0,
    }
