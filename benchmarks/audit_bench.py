"""One-run audit benchmark: the empirical epsilon lower bound of the DP-SGD implementation (audit.dpsgd_audit,
Steinke, Nasr & Jagielski 2023) at the demo's and the reproduction's DP-SGD settings, for the honest
implementation and three broken ones (noise off, clipping off, sampling at twice the charged rate), and
its time on this machine.

    python -m benchmarks.audit_bench [--full]      # prints the Markdown section
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import torch

from benchmarks.common import md_table

DELTA = 1e-5


def _variants() -> dict[str, Callable[..., Any] | None]:
    from audit.broken_dpsgd import double_rate, no_clipping, no_noise

    return {"DP on (honest)": None, "noise off": no_noise, "clipping off": no_clipping,
            "sampling at 2q, charged q": double_rate}


def settings() -> list[tuple[str, Any]]:
    """(label, DpSgdSetting) for the demo's release and the reproduction's PrivImage runs at epsilon 1 and 10."""
    from audit.dpsgd_audit import DpSgdSetting
    from benchmarks.reproduce_settings import settings as reproduce_settings
    from release.demo import DEMO_SPEC
    from synth.privimage import PrivImageConfig
    from synth.privimage.plan import plan_privimage

    out = []
    demo = {k: v for k, v in DEMO_SPEC["privimage"].items() if k not in ("public", "preset", "epsilon")}
    cfg = PrivImageConfig.demo(epsilon=DEMO_SPEC["privimage"]["epsilon"], delta=DELTA, **demo)
    out.append(("demo (eps 8 incl. query)", cfg))
    rep = reproduce_settings("cpu")["privimage"]
    for eps in (1.0, 10.0):
        out.append((f"reproduction cpu (eps {eps:g})", PrivImageConfig(epsilon=eps, delta=DELTA, **rep)))
    result = []
    for label, c in out:
        plan = plan_privimage(c, 4000)  # MNIST-5k's 4,000 training images
        result.append((label, DpSgdSetting(plan.sample_rate, plan.noise_multiplier, plan.steps, c.max_grad_norm,
                                           DELTA, c.lr, c.ema_decay, label)))
    return result


def run(quick: bool = True) -> str:
    from audit.dpsgd_audit import compute_implementation_audit, detection_text
    from synth.datasets import uci_digits

    t_all = time.time()
    public, m = uci_digits(), 1000 if quick else 4000
    rows = []
    for label, setting in settings():
        for name, trainer in _variants().items():
            audit = compute_implementation_audit(setting, public, trainer=trainer, m=m, seed=0)
            status, _ = detection_text(audit)
            b, g = audit.bound, audit.gaussian
            rows.append([label, f"q {setting.sample_rate:.4g}, sigma {setting.noise_multiplier:.3f}, "
                         f"T {setting.steps}", name, f"{audit.claimed_epsilon:.3f}", f"{b.eps_lower:.3f}",
                         f"{b.max_certifiable:.2f}", f"{g.eps_lower:.3f}", status, f"{audit.run.seconds:.1f}"])
            print(f"audit bench: {label} {name}: {b.eps_lower:.2f} ({status})", file=sys.stderr, flush=True)
    lines = ["## One-run audit of the DP-SGD implementation", "",
             f"audit.dpsgd_audit: the mechanism's dp_finetune at each setting's q, sigma, steps and clipping, on UCI "
             f"digits (public) plus {m} canaries, each included with probability 1/2; delta = {DELTA:g}; torch threads "
             f"1 per run ({torch.get_num_threads()} available). 'DP-SGD epsilon charged' is the RDP epsilon of the "
             "DP-SGD event alone. The bound holds at 95%; 'ceiling' is what all-correct guesses could certify with "
             "this many canaries, so a claim above the ceiling cannot be refuted by this audit (status 'consistent' "
             "then says 'could not prove'). 'Gaussian estimate' is the 95% lower limit of a Gaussian fit to the "
             "score distributions (Andrew et al. 2024): evidence, not proof; it fails the check when above the claim.",
             "", md_table(["setting", "DP-SGD", "implementation", "DP-SGD epsilon charged", "one-run lower bound (95%)",
                           "ceiling", "Gaussian estimate (lower)", "status", "seconds"], rows), "",
             f"Total: {time.time() - t_all:.0f} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run(quick="--full" not in sys.argv))
