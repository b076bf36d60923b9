"""Run sizes of `make reproduce`: micro (pipeline smoke run, minutes), cpu (default: the demo's
recipe, 2
CPU cores) and full (sized for one GPU). Every number that shapes a result is here and is printed into
REPRODUCTION.md."""

from __future__ import annotations

from typing import Any

from synth.mechanisms.privimage.config import DEMO_RECIPE

MODES = ("micro", "cpu", "full")
EPSILONS = (1.0, 5.0, 10.0)
AUDIT_EPSILONS = (1.0, 10.0)  # plus infinity (a non-private model trained for the audit)
KS = (2, 5, 10)
DELTA = 1e-5
SEED = 0


VOTE_KEYS = ("vote_sigma", "vote_rounds", "vote_pool")


def vote_settings(epsilon: float) -> dict[str, Any]:
    """The private vote's noise, rounds and candidates per image at `epsilon`
    (BENCHMARKS-NOTEBOOK.md, "Private vote").
    Four rounds at sigma 2 (the demo) compose to one Gaussian query at sigma 1: at epsilon 5 that would double
    the DP-SGD noise, so sigma 3 there; at epsilon 1 four rounds do not fit at any useful noise, so
    one round at
    sigma 8 (DP-SGD noise 2.92 instead of 2.53 without a vote). Eight candidates per image where the vote noise
    is 2 (CNN 0.883 over 5 runs at epsilon 10 against 0.831 with four); at sigma 3 the eight share the votes
    four would get and the noise drowns the difference (0.839 against 0.835 at epsilon 5), so four there."""
    if epsilon >= 8:
        return {"vote_sigma": 2.0, "vote_rounds": 4, "vote_pool": 8}
    if epsilon >= 4:
        return {"vote_sigma": 3.0, "vote_rounds": 4, "vote_pool": 4}
    return {"vote_sigma": 8.0, "vote_rounds": 1, "vote_pool": 4}


def privimage_config(
    s: dict[str, Any], epsilon: float, selection: str = "semantic", device: str = "auto"
) -> Any:
    """The PrivImageConfig of one reproduction run: the mode's recipe and the vote of `epsilon`."""
    from synth.mechanisms.privimage import PrivImageConfig

    recipe = s["privimage"] | s["vote"][f"{epsilon:g}"]
    return PrivImageConfig.create(
        epsilon=epsilon,
        delta=s["delta"],
        seed=s["seed"],
        query_sigma=s["query_sigma"],
        selection=selection,
        device=device,
        **recipe,
    )


def settings(mode: str) -> dict[str, Any]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "micro":
        privimage = dict(
            k=1,
            classifier_epochs=1,
            unet_channels=(8, 16),
            train_timesteps=200,
            pretrain_steps=20,
            pretrain_batch=32,
            finetune_epochs=0.15,
            batch_size=200,
            max_physical_batch=100,
            checkpoint_every=50,
            ddim_steps=5,
            n_samples=100,
            sample_batch=100,
            variation_strength=0.4,
            release_variations=1,
        )
    elif (
        mode == "cpu"
    ):  # the demo preset's recipe (PrivImageConfig.demo), the vote set per epsilon below
        privimage = {k: v for k, v in DEMO_RECIPE.items() if k not in VOTE_KEYS} | {"k": 1}
    else:  # one GPU: the demo's recipe with the 4x wider UNet (BENCHMARKS-NOTEBOOK.md, width
        # ablation: 0.927 without DP vs 0.871), twice the pre-training steps at twice the batch,
        # larger DP-SGD batches and more released images
        privimage = {k: v for k, v in DEMO_RECIPE.items() if k not in VOTE_KEYS} | dict(
            k=1,
            unet_channels=(32, 64, 64),
            pretrain_steps=4000,
            pretrain_batch=128,
            finetune_epochs=8.0,
            batch_size=500,
            max_physical_batch=1000,
            checkpoint_every=100,
            n_samples=10000,
            sample_batch=1000,
        )
        # max_physical_batch: one pass per Poisson batch (at 500, about half the batches took two
        # passes; measured
        # with 500 on 2026-11-26, BENCHMARKS-NOTEBOOK.md "PrivImage GPU preset")
    return {
        "mode": mode,
        "seed": SEED,
        "repeats": 1,  # every baseline and k-SALSA setting runs once
        # PrivImage runs per epsilon: they differ in the DP noise (OS entropy), so their spread is
        # what a steward
        # re-running one spec would see; seeds, data and the cached public pre-training are the same
        "privimage_repeats": {"micro": 2, "cpu": 3, "full": 3}[mode],
        # micro: two candidates per image whatever the epsilon (a smoke run)
        "vote": {
            f"{eps:g}": vote_settings(eps) | ({"vote_pool": 2} if mode == "micro" else {})
            for eps in EPSILONS
        },
        "delta": DELTA,
        "privimage": privimage,
        "query_sigma": 10.0,
        # non-private diffusion model (epsilon = infinity) for the audit: same UNet, trained on the
        # sensitive set
        "nonprivate_steps": {"micro": 30, "cpu": 1200, "full": 20000}[mode],
        "nonprivate_batch": {"micro": 32, "cpu": 64, "full": 128}[mode],
        "mia_samples": {"micro": 100, "cpu": 500, "full": 1000}[
            mode
        ],  # members and non-members each
        "one_run_canaries": {"micro": 200, "cpu": 1000, "full": 2000}[mode],  # one-run DP-SGD audit
        "cnn_epochs": {"micro": 1, "cpu": 10, "full": 10}[mode],
        # k-SALSA: sensitive images per class, and KSalsaConfig overrides
        "ksalsa_per_class": {"micro": 10, "cpu": 100, "full": 400}[mode],
        "ksalsa": {
            "micro": dict(steps=2, cluster_batch=64, feature_size=32, codec_epochs=2),
            "cpu": dict(steps=30, cluster_batch=64, feature_size=48, codec_epochs=30),
            "full": dict(steps=30, cluster_batch=32, feature_size=64, codec_epochs=30),
        }[mode],
        "ksalsa_fashion_per_class": 200,
        "attack_samples": {"micro": 50, "cpu": 1000, "full": 1000}[mode],
        "grid_per_class": 2,
    }
