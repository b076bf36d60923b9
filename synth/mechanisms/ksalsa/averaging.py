"""One representative image per cluster, four ways:

- pixel    (k-Same-Pixel): the pixel mean of the members.
- pca      (k-Same-PCA / k-Same-Eigen): the mean of the members' PCA codes, mapped back to
           pixels. The basis is fitted on the kept sensitive images, as in k-Same-Eigen; only
           the averages leave.
- centroid (k-Centroid): G(mean of the members' latent codes).
- ksalsa   : start from the mean latent, optimise it with lambda*content + (1-lambda)*style (local
           style alignment, synth/mechanisms/ksalsa/style.py); batches of clusters are optimised
           together.
All return float tensors (n_clusters, C, H, W) in [-1, 1].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from synth.mechanisms.ksalsa.codec import LatentCodec
from synth.mechanisms.ksalsa.config import KSalsaConfig
from synth.mechanisms.ksalsa.style import StyleContentNet, content_loss, source_style, style_loss
from synth.progress import ProgressFn, no_progress


@dataclass
class OptimisationTrace:
    """Per step, the mean (over the batch's clusters) of each loss; for tests and benchmarks."""

    style: list[float] = field(default_factory=list)
    content: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)

    def record(self, total: torch.Tensor, style: torch.Tensor, content: torch.Tensor) -> None:
        for name, value in (("total", total), ("style", style), ("content", content)):
            getattr(self, name).append(value.detach().mean().item())


def pixel_means(x: torch.Tensor, clusters: list[np.ndarray]) -> torch.Tensor:
    return torch.stack([x[torch.as_tensor(c)].mean(0) for c in clusters])


def pca_means(
    x: torch.Tensor, clusters: list[np.ndarray], components: int, seed: int = 0
) -> torch.Tensor:
    from sklearn.decomposition import PCA

    flat = x.flatten(1).numpy().astype(np.float64)
    # the remainder is not released and does not shape the basis
    kept = flat[np.concatenate(clusters)]
    pca = PCA(n_components=min(components, kept.shape[0], kept.shape[1]), random_state=seed).fit(
        kept
    )
    codes = pca.transform(flat)
    means = np.stack([codes[c].mean(0) for c in clusters])
    out = pca.inverse_transform(means).reshape(len(clusters), *x.shape[1:])
    return torch.from_numpy(np.clip(out, -1.0, 1.0).astype(np.float32))


@torch.no_grad()
def centroid_images(
    codec: LatentCodec,
    latents: torch.Tensor,
    clusters: list[np.ndarray],
    device: str,
    batch: int = 256,
) -> torch.Tensor:
    z = torch.stack([latents[torch.as_tensor(c)].mean(0) for c in clusters])
    return torch.cat(
        [
            codec.decode(z[i : i + batch].to(device)).clamp(-1, 1).cpu()
            for i in range(0, len(z), batch)
        ]
    )


def optimise_batch(
    codec: LatentCodec,
    net: StyleContentNet,
    sources: torch.Tensor,
    z0: torch.Tensor,
    config: KSalsaConfig,
) -> tuple[torch.Tensor, OptimisationTrace]:
    """k-SALSA for a batch of B clusters. sources (B, K, C, H, W) real member images in [-1, 1];
    z0 (B, D) their mean latents. Returns G(z*) (B, C, H, W) and the loss trace."""
    lam = config.lambda_content
    src_style = source_style(net, sources, config.grid)
    with torch.no_grad():
        if config.content_target == "centroid":
            target = net.content(codec.decode(z0))
        else:
            target = net.content(sources.flatten(0, 1)).view(*sources.shape[:2], -1).mean(1)
    z = z0.clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=config.lr)
    trace = OptimisationTrace()

    def losses() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        img = codec.decode(z)
        ls = style_loss(net, img, src_style, config.grid) if lam < 1 else z.new_zeros(len(z))
        lc = content_loss(net, img, target) if lam > 0 else z.new_zeros(len(z))
        return lam * lc + (1 - lam) * ls, ls, lc

    for _ in range(config.steps):
        total, ls, lc = losses()
        trace.record(total, ls, lc)
        opt.zero_grad(set_to_none=True)
        # clusters are independent: summing keeps each one's gradient its own
        total.sum().backward()
        opt.step()
    with torch.no_grad():
        trace.record(*losses())
        return codec.decode(z).clamp(-1, 1), trace


# runs batches of clusters, each (members' images, mean latents) as numpy, wherever the runner
# runs items: the representatives (B, C, H, W) and the trace of each, in batch order
BatchMap = Callable[[list[tuple[np.ndarray, np.ndarray]]], list[tuple[np.ndarray, Any]]]


def ksalsa_images(
    codec: LatentCodec,
    net: StyleContentNet,
    x: torch.Tensor,
    latents: torch.Tensor,
    clusters: list[np.ndarray],
    config: KSalsaConfig,
    device: str,
    progress: ProgressFn = no_progress,
    map_batches: BatchMap | None = None,
) -> tuple[torch.Tensor, list[OptimisationTrace]]:
    """Batches of `config.cluster_batch` clusters optimised together: here, or each batch handed
    to `map_batches` (the run's per-item work)."""
    total = len(clusters)
    batches = [
        torch.as_tensor(np.stack(clusters[i : i + config.cluster_batch]))  # (B, K): k members
        for i in range(0, total, config.cluster_batch)
    ]
    if map_batches is not None:
        done = map_batches([(x[idx].numpy(), latents[idx].mean(1).numpy()) for idx in batches])
        return torch.cat([torch.from_numpy(img) for img, _ in done]), [t for _, t in done]
    out, traces = [], []
    for i, idx in enumerate(batches):
        z0 = latents[idx].mean(1).to(device)
        img, trace = optimise_batch(codec, net, x[idx].to(device), z0, config)
        out.append(img.cpu())
        traces.append(trace)
        progress(
            "k-SALSA optimisation (clusters)", min((i + 1) * config.cluster_batch, total), total
        )
    return torch.cat(out), traces


def representatives(
    method: str,
    codec: LatentCodec,
    x: torch.Tensor,
    latents: torch.Tensor,
    clusters: list[np.ndarray],
    config: KSalsaConfig,
    device: str,
    net: StyleContentNet | None = None,
    progress: ProgressFn = no_progress,
    map_batches: BatchMap | None = None,
) -> tuple[torch.Tensor, float]:
    """The method's representatives and the seconds it took (averaging only, not
    encoding/clustering); `map_batches`: where k-SALSA's batches run (here by default)."""
    t0 = time.perf_counter()
    total = len(clusters)
    if method == "pixel":
        out = pixel_means(x, clusters)
    elif method == "pca":
        out = pca_means(x, clusters, config.pca_components, config.seed)
    elif method == "centroid":
        out = centroid_images(codec, latents, clusters, device)
    else:
        if net is None:
            from synth.mechanisms.ksalsa.style import EfficientNetStyleContent

            net = EfficientNetStyleContent(device, config.feature_size, config.style_layers)
        out, _ = ksalsa_images(
            codec, net, x, latents, clusters, config, device, progress, map_batches
        )
    if method != "ksalsa":
        progress(f"{method} averaging (clusters)", total, total)
    return out, time.perf_counter() - t0
