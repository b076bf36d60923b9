"""PrivImage reproduction (paper Table 3 / Figure 5 shape) and its privacy audit.

For epsilon in EPSILONS x {PrivImage, DPDM-style, PDP-Diffusion-style}: one charged run through
`release.runner.run_direct` on a throw-away workspace (PrivImage: `privimage_repeats` runs), then FID
(EfficientNet-Lite0 features) against the sensitive set and LR / MLP / CNN accuracy on the real held-out set
(audit package). Audit: loss-threshold membership inference on the PrivImage models at epsilon in AUDIT_EPSILONS and
on the same UNet trained without DP (epsilon = infinity). The one-run audit of the DP-SGD code is its own
section (benchmarks/reproduce_audit.py)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audit.fidelity import compute_fid as fid
from audit.images import audit_cache, sample_idx
from audit.mia import compute_mia
from audit.policy import AuditPolicy
from audit.utility import compute_utility
from benchmarks.common import throwaway_store
from benchmarks.reproduce_settings import privimage_config
from synth.kinds.datasets import ImageDataset

METHODS = (
    ("PrivImage", "semantic"),
    ("DPDM-style (no pre-training)", "none"),
    ("PDP-Diffusion-style (all public)", "all"),
)
GridFn = Callable[[str, np.ndarray, np.ndarray], None]
SaveFn = Callable[[dict], None]


def _log(msg: str) -> None:
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _accuracies(
    images: np.ndarray, labels: np.ndarray, test: ImageDataset, cnn_epochs: int, seed: int
) -> dict:
    policy = AuditPolicy(cnn_epochs=cnn_epochs, seed=seed, utility_train_samples=len(images))
    return dict(compute_utility(images, labels, None, test, policy).release)


def _mia(
    loss_fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
    members: ImageDataset,
    nonmembers: ImageDataset,
    n: int,
    delta: float,
    seed: int,
) -> dict[str, Any]:
    """The audit's loss-threshold attack (compute_mia), in the shape the report reads."""
    a = compute_mia(
        loss_fn, members, nonmembers, delta, AuditPolicy(mia_samples=n, seed=seed)
    ).attacks["loss"]
    return {
        "n": min(n, len(members), len(nonmembers)),
        "auc": a["auc"],
        "tpr_at_1pct_fpr": a["tpr_at_1pct_fpr"],
        "eps_lower": a["epsilon_bound"]["eps_lower"],
        "eps_point": a["epsilon_bound"]["eps_point"],
        "roc": {
            "fpr": np.asarray(a["roc"]["fpr"]).tolist(),
            "tpr": np.asarray(a["roc"]["tpr"]).tolist(),
        },
    }


def _nonprivate_model(sens: ImageDataset, cfg, s: dict, device: torch.device, tmp: Path):
    """The UNet of `cfg` (a PrivImageConfig) trained without DP on the sensitive set (plain DDPM
    training,
    the pre-training code)."""
    from synth.mechanisms.privimage.data import label_index, to_format, to_tensor
    from synth.mechanisms.privimage.model import make_unet
    from synth.mechanisms.privimage.precision import resolve_precision
    from synth.mechanisms.privimage.training import pretrain

    torch.manual_seed(cfg.seed)
    model = make_unet(
        cfg.image_size, 1, len(sens.label_set), cfg.unet_channels, cfg.layers_per_block
    )
    x = to_tensor(to_format(sens.images, cfg.image_size, 1))
    y = torch.from_numpy(label_index(sens.labels, sens.label_set))
    return pretrain(
        model,
        x,
        y,
        steps=s["nonprivate_steps"],
        batch=s["nonprivate_batch"],
        lr=cfg.pretrain_lr,
        train_timesteps=cfg.train_timesteps,
        seed=cfg.seed,
        device=device,
        ckpt=tmp / "nonprivate.pt",
        precision=resolve_precision(cfg.precision, device),
    )


def run(
    s: dict[str, Any],
    tmp: Path,
    grid: GridFn,
    samples_dir: Path | None = None,
    save: SaveFn = lambda partial: None,
) -> dict[str, Any]:
    """`samples_dir`: where to keep each run's synthetic images (npz), to re-evaluate without
    retraining.
    `save` gets the section's results so far after every run (a long reproduction keeps what it measured)."""
    with audit_cache():  # FID statistics of the sensitive set: computed once, dropped at the end
        return _run(s, tmp, grid, samples_dir, save)


def _real_reference(
    sens: ImageDataset, test: ImageDataset, n_fake: int, s: dict[str, Any]
) -> dict[str, Any]:
    """Real data (the non-private upper bound) and the FID floor of real held-out images."""
    t = time.time()
    rng = np.random.default_rng(s["seed"])
    real = {
        "acc": _accuracies(sens.images, sens.labels, test, s["cnn_epochs"], s["seed"]),
        "fid_heldout": fid(test.images[sample_idx(len(test), n_fake, rng)], sens.images),
        "seconds": time.time() - t,
    }
    _log(f"privimage: real reference done {real}")
    return real


def _row(
    res,
    eps: float,
    name: str,
    mode: str,
    t_run: float,
    sens: ImageDataset,
    test: ImageDataset,
    s: dict[str, Any],
) -> dict[str, Any]:
    """One table row: the run's guarantee and parameters, FID and downstream accuracy (audit compute_*)."""
    p, g = res.parameters, res.guarantee.as_dict()
    return {
        "epsilon": eps,
        "method": name,
        "selection": mode,
        "eps_rdp": g["epsilon_rdp"],
        "eps_pld": g["epsilon_pld"],
        "noise_multiplier": p["noise_multiplier"],
        "steps": p["steps"],
        "selection_ratio": p.get("selection_ratio", 1.0 if mode == "all" else None),
        "selected": p.get("selected_public_classes"),
        "seconds_run": t_run,
        "fid": fid(res.images, sens.images),
        "acc": _accuracies(res.images, res.labels, test, s["cnn_epochs"], s["seed"]),
    }


def _nonprivate(
    out: dict[str, Any],
    sens: ImageDataset,
    test: ImageDataset,
    base,
    s: dict[str, Any],
    dev: torch.device,
    tmp: Path,
    grid: GridFn,
) -> None:
    """epsilon = infinity: the same UNet without DP, on the sensitive set (audit row and sample quality)."""
    from synth.mechanisms.privimage import per_sample_diffusion_loss
    from synth.mechanisms.privimage.precision import resolve_precision
    from synth.mechanisms.privimage.sampling import balanced_labels, sample_images

    seed = s["seed"]
    t = time.time()
    model = _nonprivate_model(sens, base, s, dev, tmp)
    t_train = time.time() - t
    T = base.train_timesteps
    m = _mia(
        lambda im, lb: per_sample_diffusion_loss(model, im, lb, train_timesteps=T),
        sens,
        test,
        s["mia_samples"],
        s["delta"],
        seed,
    )
    out["audit"].append(
        {"epsilon": float("inf"), **m, "seconds": time.time() - t, "train_seconds": t_train}
    )
    pos = balanced_labels(s["privimage"]["n_samples"], 10)
    imgs = sample_images(
        model,
        pos,
        image_size=base.image_size,
        channels=1,
        train_timesteps=T,
        ddim_steps=base.ddim_steps,
        sampler=base.sampler,
        batch=base.sample_batch,
        seed=seed,
        device=dev,
        precision=resolve_precision(base.precision, dev),
    )
    labels = np.asarray(sens.label_set, dtype=np.int64)[pos]
    out["nonprivate_diffusion"] = {
        "fid": fid(imgs, sens.images),
        "acc": _accuracies(imgs, labels, test, s["cnn_epochs"], seed),
        "train_steps": s["nonprivate_steps"],
        "train_seconds": t_train,
    }
    grid("privimage_nonprivate", imgs, labels)


def _run(
    s: dict[str, Any], tmp: Path, grid: GridFn, samples_dir: Path | None, save: SaveFn
) -> dict[str, Any]:
    from synth.kinds.datasets import fashion_available, load_source, public_pool
    from synth.mechanisms.privimage.data import pick_device
    from synth.mechanisms.privimage.precision import resolve_precision

    t_all = time.time()
    dev = pick_device("auto")
    sens, test, pub = (
        load_source("builtin:mnist5k"),
        load_source("builtin:mnist5k-heldout"),
        public_pool(),
    )
    out: dict[str, Any] = {
        "device": str(dev),
        "n_sensitive": len(sens),
        "n_test": len(test),
        "public": pub.source,
        "n_public": len(pub),
        "public_classes": len(pub.label_set),
        "fashion_installed": fashion_available(),
        "rows": [],
        "audit": [],
        "precision": resolve_precision("auto", dev),
    }
    out["real"] = _real_reference(sens, test, s["privimage"]["n_samples"], s)
    # Pre-training reads public data only, so runs share it through the public cache (a fresh one
    # per
    # reproduction): PDP-Diffusion-style pre-trains once for all epsilons, PrivImage once per
    # distinct DP
    # selection. Each run's "run s" includes a pre-training only where it trained one.
    with _public_cache(tmp / "public-cache"):
        # First pass: every method once per epsilon; then the further PrivImage runs (the spread).
        for repeat in range(s.get("privimage_repeats", 1)):
            for eps in s["epsilons"]:
                for name, mode in METHODS if repeat == 0 else METHODS[:1]:
                    _one_run(
                        out,
                        s,
                        eps,
                        name,
                        mode,
                        repeat,
                        dev,
                        sens,
                        test,
                        pub,
                        tmp,
                        grid,
                        samples_dir,
                    )
                    out["seconds"] = time.time() - t_all
                    save(out)
        base = privimage_config(s, max(s["epsilons"]), device=str(dev))
        _nonprivate(out, sens, test, base, s, dev, tmp, grid)
    _log(
        f"non-private diffusion: {out['nonprivate_diffusion']}; audit {out['audit'][-1]['auc']:.3f}"
    )
    out["seconds"] = time.time() - t_all
    return out


@contextmanager
def _public_cache(path: Path) -> Iterator[None]:
    before = os.environ.get("PRIVRELEASE_CACHE")
    os.environ["PRIVRELEASE_CACHE"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PRIVRELEASE_CACHE", None)
        else:
            os.environ["PRIVRELEASE_CACHE"] = before


def _one_run(
    out: dict[str, Any],
    s: dict[str, Any],
    eps: float,
    name: str,
    mode: str,
    repeat: int,
    dev: torch.device,
    sens: ImageDataset,
    test: ImageDataset,
    pub: ImageDataset,
    tmp: Path,
    grid: GridFn,
    samples_dir: Path | None,
) -> None:
    """One charged run on a throw-away workspace, scored into out["rows"] (and the MIA audit on the
    first
    PrivImage model at each audited epsilon)."""
    from release.runner import run_direct
    from synth.mechanisms.privimage import per_sample_diffusion_loss

    tag = f"{mode}-{eps:g}-{repeat + 1}"
    store = throwaway_store(tmp / f"privimage-{tag}" / "ws", "mnist5k", sens, eps, s["delta"])
    t = time.time()
    res = run_direct(
        store,
        "mnist5k",
        sens,
        pub,
        "privimage",
        privimage_config(s, eps, mode, str(dev)),
        run_id=f"reproduce-{tag}",
        workdir=tmp / f"privimage-{tag}" / "run",
    )
    t_run = time.time() - t
    if samples_dir is not None:
        samples_dir.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            samples_dir / f"{mode}-eps{eps:g}-run{repeat + 1}.npz",
            images=res.images,
            labels=res.labels,
        )
    row = {**_row(res, eps, name, mode, t_run, sens, test, s), "run": repeat + 1}
    out["rows"].append(row)
    _log(
        f"privimage eps={eps:g} {name} run {repeat + 1}: fid {row['fid']:.2f} acc {row['acc']} ({t_run:.0f} s)"
    )
    if repeat == 0 and eps == max(s["epsilons"]):
        grid(f"privimage_{mode}", res.images, res.labels)
    if repeat == 0 and mode == "semantic" and eps in s["audit_epsilons"]:
        t = time.time()
        model_path = res.artifacts["model"]
        m = _mia(
            lambda im, lb: per_sample_diffusion_loss(model_path, im, lb),
            sens,
            test,
            s["mia_samples"],
            s["delta"],
            s["seed"],
        )
        out["audit"].append({"epsilon": eps, **m, "seconds": time.time() - t})
        _log(f"audit eps={eps:g}: auc {m['auc']:.3f} tpr@1% {m['tpr_at_1pct_fpr']:.3f}")
