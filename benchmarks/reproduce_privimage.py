"""PrivImage reproduction (paper Table 3 / Figure 5 shape) and its privacy audit.

For epsilon in EPSILONS x {PrivImage, DPDM-style, PDP-Diffusion-style}: one charged run through
`release.runner.run_direct` on a throw-away workspace, then FID (EfficientNet-Lite0 features)
against the sensitive set and LR / MLP / CNN accuracy on the real held-out set (audit package).
Audit: loss-threshold membership inference on the PrivImage models at epsilon in AUDIT_EPSILONS and
on the same UNet trained without DP (epsilon = infinity)."""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from audit.epsilon_bound import epsilon_lower_bound
from audit.fidelity import fid
from audit.images import sample_idx
from audit.mia import attack_stats
from audit.policy import AuditPolicy
from audit.utility import classifier_accuracies
from benchmarks.common import throwaway_store
from synth.datasets import ImageDataset
from synth.privimage.state import PRETRAIN

METHODS = (("PrivImage", "semantic"), ("DPDM-style (no pre-training)", "none"),
           ("PDP-Diffusion-style (all public)", "all"))
GridFn = Callable[[str, np.ndarray, np.ndarray], None]


def _log(msg: str) -> None:
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _accuracies(images: np.ndarray, labels: np.ndarray, test: ImageDataset, cnn_epochs: int, seed: int) -> dict:
    policy = AuditPolicy(cnn_epochs=cnn_epochs, seed=seed)
    return classifier_accuracies(images, labels, test.images, test.labels, 10, policy)


def _mia(loss_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], members: ImageDataset, nonmembers: ImageDataset,
         n: int, delta: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    mem = members.subset(sample_idx(len(members), n, rng))
    non = nonmembers.subset(sample_idx(len(nonmembers), n, rng))
    ms, ns = -loss_fn(mem.images, mem.labels), -loss_fn(non.images, non.labels)  # score: low loss = member
    stats = attack_stats(ms, ns)
    bound = epsilon_lower_bound(ms, ns, delta, 0.95, seed=seed)
    return {"n": len(mem), "auc": stats["auc"], "tpr_at_1pct_fpr": stats["tpr_at_1pct_fpr"],
            "eps_lower": bound["eps_lower"], "eps_point": bound["eps_point"],
            "roc": {"fpr": stats["fpr"].tolist(), "tpr": stats["tpr"].tolist()}}


def _nonprivate_model(sens: ImageDataset, cfg, s: dict, device: torch.device, tmp: Path):
    """The UNet of `cfg` (a PrivImageConfig) trained without DP on the sensitive set (plain DDPM training,
    the pre-training code)."""
    from synth.privimage.data import label_index, to_format, to_tensor
    from synth.privimage.model import make_unet
    from synth.privimage.training import pretrain

    torch.manual_seed(cfg.seed)
    model = make_unet(cfg.image_size, 1, len(sens.label_set), cfg.unet_channels, cfg.layers_per_block)
    x = to_tensor(to_format(sens.images, cfg.image_size, 1))
    y = torch.from_numpy(label_index(sens.labels, sens.label_set))
    return pretrain(model, x, y, steps=s["nonprivate_steps"], batch=s["nonprivate_batch"], lr=cfg.pretrain_lr,
                    train_timesteps=cfg.train_timesteps, seed=cfg.seed, device=device, ckpt=tmp / "nonprivate.pt")


def run(s: dict[str, Any], tmp: Path, grid: GridFn, samples_dir: Path | None = None) -> dict[str, Any]:
    """`samples_dir`: where to keep each run's synthetic images (npz), to re-evaluate without retraining."""
    from synth.datasets import fashion_available, load_source, public_pool
    from release.runner import run_direct
    from synth.privimage import PrivImageConfig, per_sample_diffusion_loss
    from synth.privimage.data import pick_device
    from synth.privimage.sampling import balanced_labels, sample_images

    t_all = time.time()
    dev = pick_device("auto")
    sens, test, pub = load_source("builtin:mnist5k"), load_source("builtin:mnist5k-heldout"), public_pool()
    pi, delta, seed = s["privimage"], s["delta"], s["seed"]
    out: dict[str, Any] = {"device": str(dev), "n_sensitive": len(sens), "n_test": len(test), "public": pub.source,
                           "n_public": len(pub), "public_classes": len(pub.label_set),
                           "fashion_installed": fashion_available(), "rows": [], "audit": []}
    n_fake = pi["n_samples"]
    # Reference rows: real data (the non-private upper bound) and the FID floor of real held-out images.
    t = time.time()
    out["real"] = {"acc": _accuracies(sens.images, sens.labels, test, s["cnn_epochs"], seed),
                   "fid_heldout": fid(test.images[sample_idx(len(test), n_fake, np.random.default_rng(seed))],
                                      sens.images), "seconds": time.time() - t}
    _log(f"privimage: real reference done {out['real']}")
    # The PDP-Diffusion-style pre-training reads public data only and does not depend on epsilon: train it
    # once and seed later runs' workdirs with the finished checkpoint (pretrain() resumes from it at its end).
    # PrivImage's pre-training depends on its DP selection, so each of its runs trains its own.
    shared_pdp_pretrain: Path | None = None
    base = PrivImageConfig(epsilon=max(s["epsilons"]), delta=delta, device=str(dev), seed=seed,
                           query_sigma=s["query_sigma"], **pi)
    for eps in s["epsilons"]:
        for name, mode in METHODS:
            root = tmp / f"privimage-{mode}-{eps:g}"
            if mode == "all" and shared_pdp_pretrain is not None:
                (root / "run").mkdir(parents=True)
                shutil.copy(shared_pdp_pretrain, root / "run" / PRETRAIN)
            store = throwaway_store(root / "ws", "mnist5k", sens, eps, delta)
            cfg = base.with_(epsilon=eps, selection=mode)
            t = time.time()
            res = run_direct(store, "mnist5k", sens, pub, "privimage", cfg, run_id=f"reproduce-{mode}-{eps:g}",
                                workdir=root / "run")
            t_run = time.time() - t
            if samples_dir is not None:
                samples_dir.mkdir(parents=True, exist_ok=True)
                np.savez_compressed(samples_dir / f"{mode}-eps{eps:g}.npz", images=res.images, labels=res.labels)
            if mode == "all" and shared_pdp_pretrain is None:
                shared_pdp_pretrain = root / "run" / PRETRAIN
            p, g = res.parameters, res.guarantee.as_dict()
            row = {"epsilon": eps, "method": name, "selection": mode, "eps_rdp": g["epsilon_rdp"],
                   "eps_pld": g["epsilon_pld"], "noise_multiplier": p["noise_multiplier"], "steps": p["steps"],
                   "selection_ratio": p.get("selection_ratio", 1.0 if mode == "all" else None),
                   "selected": p.get("selected_public_classes"), "seconds_run": t_run,
                   "fid": fid(res.images, sens.images),
                   "acc": _accuracies(res.images, res.labels, test, s["cnn_epochs"], seed)}
            out["rows"].append(row)
            _log(f"privimage eps={eps:g} {name}: fid {row['fid']:.2f} acc {row['acc']} ({t_run:.0f} s)")
            if eps == max(s["epsilons"]):
                grid(f"privimage_{mode}", res.images, res.labels)
            if mode == "semantic" and eps in s["audit_epsilons"]:
                t = time.time()
                model_path = res.artifacts["model"]
                m = _mia(lambda im, lb: per_sample_diffusion_loss(model_path, im, lb), sens, test,
                         s["mia_samples"], delta, seed)
                out["audit"].append({"epsilon": eps, **m, "seconds": time.time() - t})
                _log(f"audit eps={eps:g}: auc {m['auc']:.3f} tpr@1% {m['tpr_at_1pct_fpr']:.3f}")
    # epsilon = infinity: the same UNet without DP, on the sensitive set
    t = time.time()
    model = _nonprivate_model(sens, base, s, dev, tmp)
    t_train = time.time() - t
    T = base.train_timesteps
    m = _mia(lambda im, lb: per_sample_diffusion_loss(model, im, lb, train_timesteps=T), sens, test,
             s["mia_samples"], delta, seed)
    out["audit"].append({"epsilon": float("inf"), **m, "seconds": time.time() - t, "train_seconds": t_train})
    pos = balanced_labels(n_fake, 10)
    imgs = sample_images(model, pos, image_size=base.image_size, channels=1, train_timesteps=T,
                         ddim_steps=base.ddim_steps, batch=base.sample_batch, seed=seed, device=dev)
    labels = np.asarray(sens.label_set, dtype=np.int64)[pos]
    out["nonprivate_diffusion"] = {"fid": fid(imgs, sens.images),
                                   "acc": _accuracies(imgs, labels, test, s["cnn_epochs"], seed),
                                   "train_steps": s["nonprivate_steps"], "train_seconds": t_train}
    grid("privimage_nonprivate", imgs, labels)
    _log(f"non-private diffusion: {out['nonprivate_diffusion']}; audit {out['audit'][-1]['auc']:.3f}")
    out["seconds"] = time.time() - t_all
    return out
