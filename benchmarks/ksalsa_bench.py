"""k-SALSA benchmark: k in {2, 5, 10} x the four averaging methods on the default data.

Sensitive set: MNIST-5k (quick mode: a class-balanced subset of 500 images, 50 per class). Codec:
the default conv autoencoder trained on the PUBLIC pool (UCI digits + up to 200 Fashion-MNIST images
per class where installed), trained once and cached. Per (k, method):
- FID (EfficientNet-Lite0 features): Frechet distance between the released images and the real
  sensitive images, through torchmetrics with EfficientNet-Lite0 pooled features as the network.
  Not comparable with Inception FID; with few released images (n/k) it is biased upwards.
- Accuracy: logistic regression on pixels, trained on the released images with their majority
  labels, tested on the 1,000 real held-out MNIST-5k images.
- Membership (nearest-neighbour ranking): the audit package's cluster-membership attack did not exist
  when this was written, so this file ranks, for every representative, its k members and k random
  non-members by cosine similarity of EfficientNet-Lite0 features to the representative; reported is
  precision in the top k (chance = 50%, 100% = membership fully revealed).
- Seconds per cluster of the averaging step (encoding and clustering reported separately).

`python -m benchmarks.ksalsa_bench [--full]` prints the Markdown section.
"""
from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from synth import features
from synth.datasets import ImageDataset, fashion_available, load_source, public_pool
from synth.ksalsa import KSalsaConfig, aggregate_labels, same_size_clusters, train_codec
from synth.ksalsa.averaging import representatives
from synth.ksalsa.codec import conform, describe_codec, encode_all
from synth.ksalsa.pipeline import to_uint8
from synth.ksalsa.style import EfficientNetStyleContent

KS = (2, 5, 10)
METHODS = ("pixel", "pca", "centroid", "ksalsa")
FID_NAME = "FID (EfficientNet-Lite0 features)"


class _EffNetFeatures(torch.nn.Module):
    """torchmetrics feature network: float images in [0, 1] -> 1280-d EfficientNet-Lite0 pooled features."""

    num_features = 1280

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return features.embed(x * 2 - 1, x.device).double().to(x.device)


class Fid:
    """torchmetrics' FID with EfficientNet-Lite0 features; the real images are embedded once."""

    def __init__(self, real: torch.Tensor):
        from torchmetrics.image.fid import FrechetInceptionDistance

        self.metric = FrechetInceptionDistance(feature=_EffNetFeatures(), normalize=True, reset_real_features=False)
        self.metric.update((real + 1) / 2, real=True)

    def __call__(self, fake: torch.Tensor) -> float:
        self.metric.reset()  # keeps the real statistics
        self.metric.update((fake + 1) / 2, real=False)
        return float(self.metric.compute())


def accuracy(train_x: np.ndarray, train_y: np.ndarray, test: ImageDataset) -> float:
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(train_y)) < 2:
        return float("nan")
    clf = LogisticRegression(max_iter=500, C=0.1).fit(train_x.reshape(len(train_x), -1) / 255.0, train_y)
    return float(clf.score(test.images.reshape(len(test), -1) / 255.0, test.labels))


def nn_membership_precision(rep_feats: torch.Tensor, real_feats: torch.Tensor, clusters: list[np.ndarray],
                            k: int, seed: int = 0) -> float:
    """Mean precision@k of ranking k members + k random non-members by cosine similarity to the representative."""
    rng = np.random.default_rng(seed)
    rep = torch.nn.functional.normalize(rep_feats, dim=1)
    real = torch.nn.functional.normalize(real_feats, dim=1)
    n, hits = len(real), []
    for i, members in enumerate(clusters):
        others = np.setdiff1d(np.arange(n), members)
        cand = np.concatenate([members, rng.choice(others, size=k, replace=False)])
        score = (real[torch.as_tensor(cand)] @ rep[i]).numpy()
        top = np.argsort(-score, kind="stable")[:k]
        hits.append(np.mean(top < k))
    return float(np.mean(hits))


def _subset(data: ImageDataset, per_class: int) -> ImageDataset:
    idx = np.concatenate([np.flatnonzero(data.labels == c)[:per_class] for c in np.unique(data.labels)])
    return data.subset(idx)


def run(quick: bool = True) -> str:
    t_start = time.perf_counter()
    sensitive = load_source("builtin:mnist5k")
    if quick:
        sensitive = _subset(sensitive, 50)
    heldout = load_source("builtin:mnist5k-heldout")
    public = public_pool(max_fashion_per_class=200)
    base = KSalsaConfig.demo(2)
    device = base.resolved_device()
    workdir = Path(os.environ.get("KSALSA_BENCH_CACHE", Path(tempfile.gettempdir()) / "privrelease-ksalsa-bench"))

    t0 = time.perf_counter()
    codec = train_codec(public, workdir, base, size=28, channels=1)
    t_codec = time.perf_counter() - t0
    x = torch.from_numpy(conform(sensitive, 28, 1))
    t0 = time.perf_counter()
    latents = encode_all(codec, x, device)
    t_encode = time.perf_counter() - t0
    with torch.no_grad():
        recon_mse = float(((codec.decode(latents[:500].to(device)).cpu() - x[:500]) ** 2).mean())
    real_feats = features.embed(x, device)
    net = EfficientNetStyleContent(device, base.feature_size, base.style_layers)

    fid = Fid(x)
    rows = [f"| real held-out (reference, n={len(heldout)}) | - | - | "
            f"{fid(torch.from_numpy(heldout.as_float())):.2f} | {accuracy(sensitive.images, sensitive.labels, heldout):.3f} "
            "(trained on the real sensitive images) | - | - |"]
    for k in KS:
        t0 = time.perf_counter()
        cl = same_size_clusters(latents.numpy(), k)
        t_cluster = time.perf_counter() - t0
        majority, _ = aggregate_labels(sensitive.labels, cl.clusters, 10)
        for method in METHODS:
            cfg = base.with_(k=k, method=method)
            reps, secs = representatives(method, codec, x, latents, cl.clusters, cfg, device, net)
            imgs = to_uint8(reps)
            rep_feats = features.embed(reps, device)
            print(f"ksalsa bench: k={k} {method} done at {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
            rows.append(
                f"| k={k} | {method} | {len(cl.clusters)} / {len(cl.remainder)} | {fid(reps):.2f} | "
                f"{accuracy(imgs, majority, heldout):.3f} | {nn_membership_precision(rep_feats, real_feats, cl.clusters, k):.3f} | "
                f"{secs / len(cl.clusters):.4f} (clustering {t_cluster:.1f} s) |"
            )
    total = time.perf_counter() - t_start
    mode = (f"quick: {len(sensitive)} MNIST-5k images (50 per class)" if quick
            else f"full: all {len(sensitive)} MNIST-5k images")
    lines = [
        "## k-SALSA (k-anonymous release)",
        "",
        f"Mode {mode}; public codec data: {public.source} ({len(public)} images"
        f"{'' if fashion_available() else ', Fashion-MNIST not installed'}).",
        f"Codec: {describe_codec(codec)}; trained/loaded in {t_codec:.1f} s; reconstruction MSE on sensitive "
        f"images ([-1, 1] scale) {recon_mse:.4f}; encoding {t_encode:.2f} s.",
        f"k-SALSA settings: lambda_content={base.lambda_content}, steps={base.steps}, lr={base.lr}, grid={base.grid}, "
        f"style layers {list(base.style_layers)}, CNN input {base.feature_size} px, {base.cluster_batch} clusters per batch, "
        f"content target {base.content_target}.",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), device {device}, Python {sys.version.split()[0]}. Total {total:.0f} s.",
        "",
        f"| k | method | released / dropped | {FID_NAME} (lower = closer to real) | accuracy on real held-out "
        "(LR on pixels) | NN membership precision@k (chance 0.5) | seconds per cluster |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Membership: nearest-neighbour ranking implemented in this benchmark (the audit package's "
        "cluster-membership attack was not available); members vs. as many random non-members per representative.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run(quick="--full" not in sys.argv))
