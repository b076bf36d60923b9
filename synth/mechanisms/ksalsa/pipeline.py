"""The data path of a k-anonymous release, without ledger or storage: encode the sensitive images,
cluster their latents into groups of k, average each group, aggregate the labels. Shared by
the k-SALSA mechanism (synth/mechanisms/ksalsa/run.py) and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from accounting.errors import DataFormatError
from synth.mechanisms.ksalsa.averaging import BatchMap, representatives
from synth.mechanisms.ksalsa.codec import LatentCodec, encode_all
from synth.mechanisms.ksalsa.config import KSalsaConfig
from synth.mechanisms.ksalsa.style import StyleContentNet
from synth.progress import ProgressFn, no_progress
from synth.tools.same_size_clusters import ClusterResult, same_size_clusters


@dataclass
class Anonymised:
    images: np.ndarray  # uint8 (n_clusters, H, W) or (n_clusters, H, W, C)
    labels: np.ndarray  # majority label per cluster (ties -> smallest label)
    label_distributions: np.ndarray  # (n_clusters, n_classes): fraction of members with each label
    clusters: ClusterResult
    latents: torch.Tensor  # (N, D) latents of all sensitive images (internal)
    seconds_averaging: float


def aggregate_labels(
    labels: np.ndarray, clusters: list[np.ndarray], n_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Majority label and label distribution of each cluster."""
    dist = np.zeros((len(clusters), n_classes), dtype=np.float64)
    for i, c in enumerate(clusters):
        dist[i] = np.bincount(labels[c], minlength=n_classes)[:n_classes] / len(c)
    return dist.argmax(1).astype(np.int64), dist


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """[-1, 1] (N, C, H, W) -> uint8 (N, H, W) for grey, (N, H, W, C) for colour."""
    arr = ((x.detach().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    return arr[:, 0] if arr.shape[1] == 1 else np.moveaxis(arr, 1, -1)


def check_codec(codec: LatentCodec, probe: torch.Tensor, device: str) -> None:
    """Decode(encode(probe)) must give images of the probe's shape (run on PUBLIC images, before any
    sensitive data is read)."""
    with torch.no_grad():
        out = codec.decode(codec.encode(probe.to(device)))
    if tuple(out.shape) != tuple(probe.shape):
        raise DataFormatError(
            f"The codec turns images of shape {tuple(probe.shape[1:])} into "
            f"{tuple(out.shape[1:])}; it must reproduce the sensitive images' shape. Use a codec "
            "trained at that size (or set image_size)."
        )


def anonymise(
    x: torch.Tensor,
    labels: np.ndarray,
    n_classes: int,
    codec: LatentCodec,
    config: KSalsaConfig,
    *,
    net: StyleContentNet | None = None,
    progress: ProgressFn = no_progress,
    map_batches: BatchMap | None = None,
) -> Anonymised:
    """x: sensitive images (N, C, H, W) in [-1, 1]; labels (N,) int."""
    device = config.resolved_device()
    progress("encoding", 0, 1)
    latents = encode_all(codec, x, device)
    progress("encoding", 1, 1)
    clusters = same_size_clusters(latents.numpy(), config.k, progress)
    reps, seconds = representatives(
        config.method,
        codec,
        x,
        latents,
        clusters.clusters,
        config,
        device,
        net,
        progress,
        map_batches,
    )
    majority, dist = aggregate_labels(
        np.asarray(labels, dtype=np.int64), clusters.clusters, n_classes
    )
    return Anonymised(to_uint8(reps), majority, dist, clusters, latents, seconds)
