"""PrivImage benchmark: utility of synthetic MNIST-5k at epsilon 1/5/10 for PrivImage, a DPDM-style
baseline (same DP-SGD, no pre-training) and a PDP-Diffusion-style one (pre-training on the whole
public pool); DP-SGD vs non-private step time; sampling throughput.

    python -m benchmarks.privimage_bench [--full]      # prints the Markdown section
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import throwaway_store

EPSILONS = (1.0, 5.0, 10.0)
METHODS = (
    ("PrivImage", "semantic"),
    ("DPDM-style (no pre-training)", "none"),
    ("PDP-Diffusion-style (all public)", "all"),
)
DELTA = 1e-5


def settings(quick: bool) -> dict:
    if quick:  # ~15 minutes on 2 CPU cores for all 9 runs (about 3 minutes on one H100)
        return dict(
            k=1,
            classifier_epochs=6,
            unet_channels=(16, 32, 32),
            pretrain_steps=150,
            pretrain_batch=64,
            finetune_epochs=2.0,
            batch_size=200,
            max_physical_batch=100,
            checkpoint_every=50,
            ddim_steps=20,
            n_samples=500,
            sample_batch=250,
        )
    # sized for one GPU (about 5 minutes on an H100 for all 9 runs)
    return dict(
        k=1,
        classifier_epochs=6,
        unet_channels=(32, 64, 64),
        pretrain_steps=1200,
        pretrain_batch=128,
        finetune_epochs=15.0,
        batch_size=500,
        max_physical_batch=500,
        checkpoint_every=100,
        ddim_steps=30,
        n_samples=2000,
        sample_batch=1000,
    )


def downstream_accuracy(images: np.ndarray, labels: np.ndarray, test, epochs: int = 5) -> float:
    """The audit's downstream CNN (compute_utility) trained on (synthetic) images, accuracy on real held-out."""
    from audit.policy import AuditPolicy
    from audit.utility import compute_utility

    policy = AuditPolicy(cnn_epochs=epochs, utility_train_samples=len(images))
    return compute_utility(images, labels, None, test, policy).release["cnn"]


def step_time_ratio(cfg, device: torch.device, batch: int, reps: int = 5) -> tuple[float, float]:
    """Seconds per optimiser step on one batch: (DP-SGD with opacus per-sample clipping, plain)."""
    import warnings

    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    from synth.mechanisms.privimage.model import ddpm_loss, make_scheduler, make_unet

    sched = make_scheduler(cfg.train_timesteps)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def timed(model, opt) -> float:
        for i in range(reps + 1):
            if i == 1:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
            opt.zero_grad()
            ddpm_loss(model, sched, x, y).backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps

    torch.manual_seed(0)
    plain = make_unet(28, 1, 10, cfg.unet_channels, cfg.layers_per_block).to(device)
    t_plain = timed(plain, torch.optim.Adam(plain.parameters(), lr=1e-4))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gsm = GradSampleModule(
            make_unet(28, 1, 10, cfg.unet_channels, cfg.layers_per_block).to(device)
        )
        opt = DPOptimizer(
            torch.optim.Adam(gsm.parameters(), lr=1e-4),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            expected_batch_size=batch,
        )
        t_dp = timed(gsm, opt)
    return t_dp, t_plain


def run(quick: bool = True, device: str = "auto") -> str:
    from release.runner import run_direct
    from synth.kinds.datasets import fashion_available, load_source, public_pool
    from synth.mechanisms.privimage import PrivImageConfig
    from synth.mechanisms.privimage.data import pick_device

    t_all = time.time()
    if quick:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    dev = pick_device(device)
    sens, test, pub = (
        load_source("builtin:mnist5k"),
        load_source("builtin:mnist5k-heldout"),
        public_pool(),
    )
    kw = settings(quick)
    lines = [f"## PrivImage ({'quick' if quick else 'full'} settings)", ""]
    lines.append(
        f"Machine: {platform.platform()}, Python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"device {dev}{' (' + torch.cuda.get_device_name(0) + ')' if dev.type == 'cuda' else ''}, "
        f"torch threads {torch.get_num_threads()}."
    )
    lines.append(
        f"Sensitive: builtin:mnist5k ({len(sens)} images); public pool: {pub.source} ({len(pub)} images, "
        f"{len(pub.label_set)} classes{'' if fashion_available() else '; Fashion-MNIST NOT installed'}); "
        f"test: builtin:mnist5k-heldout ({len(test)}). delta = {DELTA:g}."
    )
    lines.append(
        f"Settings: {kw}, query_sigma = 20 (k = 1: with 10 sensitive and 20 public classes, k >= 2 "
        "selects every public class, selection ratio 1.0). Downstream: the audit's small CNN (compute_utility), 5 "
        "epochs on the synthetic set, accuracy on the real held-out set."
    )
    lines.append("")
    t = time.time()
    real = downstream_accuracy(sens.images, sens.labels, test)
    lines.append(
        f"Reference (non-private): the same CNN trained on the real sensitive set: accuracy {real:.3f} "
        f"({time.time() - t:.0f} s)."
    )
    lines.append("")
    lines.append(
        "| epsilon | method | accuracy | eps RDP / PLD (whole history) | noise mult. | steps | selected public "
        "classes (ratio) | run time (s) | sampling img/s |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for eps in EPSILONS:
            for name, mode in METHODS:
                root = Path(tmp) / f"{mode}-{eps:g}"
                store = throwaway_store(root / "ws", "mnist5k", sens, eps, DELTA)
                cfg = PrivImageConfig.create(
                    epsilon=eps, delta=DELTA, selection=mode, device=str(dev), **kw
                )
                t = time.time()
                res = run_direct(
                    store,
                    "mnist5k",
                    sens,
                    pub,
                    "privimage",
                    cfg,
                    run_id=f"bench-{mode}-{eps:g}",
                    workdir=root / "run",
                )
                t_run = time.time() - t
                acc = downstream_accuracy(res.images, res.labels, test)
                p, g = res.parameters, res.guarantee.as_dict()
                sel = (
                    f"{sum(len(v) for v in p['selected_public_classes'].values())} "
                    f"({p['selection_ratio']:.2f})"
                    if mode == "semantic"
                    else ("all (1.00)" if mode == "all" else "-")
                )
                ips = p["n_samples"] / max(res.internal["timings_s"]["sampling"], 1e-9)
                lines.append(
                    f"| {eps:g} | {name} | {acc:.3f} | {g['epsilon_rdp']:.3f} / {g['epsilon_pld']:.3f} | "
                    f"{p['noise_multiplier']:.3f} | {p['steps']} | {sel} | {t_run:.0f} | {ips:.0f} |"
                )
                if mode == "semantic" and eps == EPSILONS[-1]:
                    chosen = p["selected_public_classes"]
    lines.append("")
    lines.append(
        f"Selection at epsilon {EPSILONS[-1]:g} (sensitive class -> public classes): "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in chosen.items())
        + "."
    )
    lines += [
        "",
        _step_ratio_line(PrivImageConfig.create(epsilon=1.0, delta=DELTA, **kw), dev),
        f"Total benchmark time: {time.time() - t_all:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def _step_ratio_line(cfg, dev: torch.device) -> str:
    batch = cfg.max_physical_batch
    t_dp, t_plain = step_time_ratio(cfg, dev, batch)
    return (
        f"Step time on one batch of {batch} (UNet {list(cfg.unet_channels)}): DP-SGD (opacus per-sample "
        f"gradients + clipping + noise) {t_dp * 1000:.0f} ms, non-private {t_plain * 1000:.0f} ms: ratio "
        f"{t_dp / t_plain:.2f}x."
    )


if __name__ == "__main__":
    print(run(quick="--full" not in sys.argv, device="cpu" if "--cpu" in sys.argv else "auto"))
