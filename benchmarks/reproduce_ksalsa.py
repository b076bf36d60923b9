"""k-SALSA reproduction (paper Tables 1-3 shape).

For k in KS x {k-Same-Pixel, k-Same-PCA, k-Centroid, k-SALSA}, plus the ablation "k-SALSA without
patch alignment" (grid = 1: one patch per feature map, i.e. global Gram matrices, so there is
nothing to align) and the codec's own reconstructions (the paper's "GAN-inverted" row, k = 1 in
effect): FID (EfficientNet-Lite0 features) against the sensitive images, LR / MLP / CNN accuracy on
the real held-out set (majority labels), cluster-membership attack (audit.kanon_attacks) and the
nearest-record re-identification rate."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audit.fidelity import compute_fid
from audit.kanon_attacks import compute_kanon_attacks
from audit.policy import AuditPolicy
from audit.utility import compute_utility
from synth.kinds.datasets import ImageDataset

METHODS = (
    ("k-Same-Pixel", "pixel", {}),
    ("k-Same-PCA", "pca", {}),
    ("k-Centroid", "centroid", {}),
    ("k-SALSA", "ksalsa", {}),
    ("k-SALSA, no patch alignment (grid=1)", "ksalsa", {"grid": 1}),
)
GridFn = Callable[[str, np.ndarray, np.ndarray], None]


def _log(msg: str) -> None:
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def class_subset(data: ImageDataset, per_class: int) -> ImageDataset:
    idx = np.concatenate(
        [np.flatnonzero(data.labels == c)[:per_class] for c in np.unique(data.labels)]
    )
    return data.subset(idx)


def _evaluate(
    images: np.ndarray,
    labels: np.ndarray,
    clusters: list[np.ndarray],
    sens: ImageDataset,
    test: ImageDataset,
    k: int | None,
    s: dict,
) -> dict[str, Any]:
    policy = AuditPolicy(
        cnn_epochs=s["cnn_epochs"],
        seed=s["seed"],
        feature_samples=s["attack_samples"],
        utility_train_samples=len(images),
    )
    acc = dict(compute_utility(images, labels, None, test, policy).release)
    attack = compute_kanon_attacks(images, clusters, sens, test, k, policy)
    return {
        "fid": compute_fid(images, sens.images),
        "acc": acc,
        "attack": attack.membership["attack_precision"],
        "attack_by_space": attack.membership["precision_by_space"],
        "reid": attack.reid_rate,
        "reid_chance": attack.reid_chance,
    }


def run(s: dict[str, Any], tmp: Path, grid: GridFn) -> dict[str, Any]:
    from synth.kinds.datasets import load_source, public_pool
    from synth.mechanisms.ksalsa import (
        KSalsaConfig,
        aggregate_labels,
        same_size_clusters,
        train_codec,
    )
    from synth.mechanisms.ksalsa.averaging import representatives
    from synth.mechanisms.ksalsa.codec import conform, describe_codec, encode_all
    from synth.mechanisms.ksalsa.pipeline import to_uint8
    from synth.mechanisms.ksalsa.style import EfficientNetStyleContent

    t_all = time.time()
    sens = class_subset(load_source("builtin:mnist5k"), s["ksalsa_per_class"])
    test = load_source("builtin:mnist5k-heldout")
    public = public_pool(max_fashion_per_class=s["ksalsa_fashion_per_class"])
    base = KSalsaConfig.create(k=2, seed=s["seed"], **s["ksalsa"])
    device = base.resolved_device()
    t = time.time()
    codec = train_codec(public, tmp / "ksalsa-codec", base, size=28, channels=1)
    t_codec = time.time() - t
    x = torch.from_numpy(conform(sens, 28, 1))
    latents = encode_all(codec, x, device)
    out: dict[str, Any] = {
        "device": device,
        "n_sensitive": len(sens),
        "n_test": len(test),
        "public": public.source,
        "n_public": len(public),
        "codec": describe_codec(codec),
        "codec_seconds": t_codec,
        "config": base.as_dict(),
        "rows": [],
    }
    # The codec's reconstructions: no anonymity at all (each "cluster" is one record).
    with torch.no_grad():
        recon = torch.cat(
            [
                codec.decode(latents[i : i + 512].to(device)).cpu()
                for i in range(0, len(latents), 512)
            ]
        )
    rec_imgs = to_uint8(recon)
    ev = _evaluate(
        rec_imgs, sens.labels, [np.array([i]) for i in range(len(sens))], sens, test, None, s
    )
    out["reconstruction"] = {**ev, "mse_pm1": float(((recon - x) ** 2).mean())}
    out["real_acc"] = dict(
        compute_utility(
            sens.images,
            sens.labels,
            None,
            test,
            AuditPolicy(
                cnn_epochs=s["cnn_epochs"], seed=s["seed"], utility_train_samples=len(sens)
            ),
        ).release
    )
    grid("ksalsa_reconstruction", rec_imgs, sens.labels)
    _log(f"ksalsa: reconstruction {out['reconstruction']['fid']:.2f}")
    net = EfficientNetStyleContent(device, base.feature_size, base.style_layers)
    for k in s["ks"]:
        t = time.time()
        cl = same_size_clusters(latents.numpy(), k)
        t_cluster = time.time() - t
        majority, _ = aggregate_labels(sens.labels, cl.clusters, 10)
        for name, method, extra in METHODS:
            cfg = base.with_(k=k, method=method, **extra)
            reps, secs = representatives(method, codec, x, latents, cl.clusters, cfg, device, net)
            imgs = to_uint8(reps)
            ev = _evaluate(imgs, majority, cl.clusters, sens, test, k, s)
            out["rows"].append(
                {
                    "k": k,
                    "method": name,
                    "released": len(cl.clusters),
                    "dropped": len(cl.remainder),
                    "seconds": secs,
                    "seconds_clustering": t_cluster,
                    **ev,
                }
            )
            _log(
                f"ksalsa k={k} {name}: fid {ev['fid']:.2f} acc {ev['acc']} attack {ev['attack']:.3f}"
            )
            if k == 5 or (k == max(s["ks"]) and 5 not in s["ks"]):
                grid(f"ksalsa_{method}{'_grid1' if extra else ''}", imgs, majority)
    out["seconds"] = time.time() - t_all
    return out
