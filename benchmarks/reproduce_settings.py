"""Run sizes of `make reproduce`: micro (pipeline smoke run, minutes), cpu (default, about 70 min on 2
CPU cores) and full (sized for one GPU). Every number that shapes a result is here and is printed into
REPRODUCTION.md."""
from __future__ import annotations

from typing import Any

from benchmarks.privimage_bench import settings as privimage_bench_settings

MODES = ("micro", "cpu", "full")
EPSILONS = (1.0, 5.0, 10.0)
AUDIT_EPSILONS = (1.0, 10.0)      # plus infinity (a non-private model trained for the audit)
KS = (2, 5, 10)
DELTA = 1e-5
SEED = 0


def settings(mode: str) -> dict[str, Any]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "micro":
        privimage = dict(k=1, classifier_epochs=1, unet_channels=(8, 16), train_timesteps=200, pretrain_steps=20,
                         pretrain_batch=32, finetune_epochs=0.15, batch_size=200, max_physical_batch=100,
                         checkpoint_every=50, ddim_steps=5, n_samples=100, sample_batch=100)
    elif mode == "cpu":  # the PrivImage benchmark's quick settings with 5x the pre-training and 2x the DP epochs
        privimage = {**privimage_bench_settings(quick=True), "pretrain_steps": 800, "finetune_epochs": 4.0}
    else:  # the PrivImage benchmark's full (GPU) settings
        privimage = privimage_bench_settings(quick=False)
    return {
        "mode": mode,
        "seed": SEED,
        "repeats": 1,  # every setting runs once (no error bars); the spread is discussed in the report
        "delta": DELTA,
        "privimage": privimage,
        "query_sigma": 10.0,
        # non-private diffusion model (epsilon = infinity) for the audit: same UNet, trained on the sensitive set
        "nonprivate_steps": {"micro": 30, "cpu": 1200, "full": 20000}[mode],
        "nonprivate_batch": {"micro": 32, "cpu": 64, "full": 128}[mode],
        "mia_samples": {"micro": 100, "cpu": 500, "full": 1000}[mode],   # members and non-members each
        "one_run_canaries": {"micro": 200, "cpu": 1000, "full": 2000}[mode],  # one-run DP-SGD audit
        "cnn_epochs": {"micro": 1, "cpu": 10, "full": 10}[mode],
        # k-SALSA: sensitive images per class, and KSalsaConfig overrides
        "ksalsa_per_class": {"micro": 10, "cpu": 100, "full": 400}[mode],
        "ksalsa": {"micro": dict(steps=2, cluster_batch=64, feature_size=32, codec_epochs=2),
                   "cpu": dict(steps=30, cluster_batch=64, feature_size=48, codec_epochs=30),
                   "full": dict(steps=30, cluster_batch=32, feature_size=64, codec_epochs=30)}[mode],
        "ksalsa_fashion_per_class": 200,
        "attack_samples": {"micro": 50, "cpu": 1000, "full": 1000}[mode],
        "grid_per_class": 2,
    }
