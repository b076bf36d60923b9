"""k-SALSA's optimisation as per-item work (the entry's per-item function): each batch of clusters
(their members' images and mean latent) is optimised wherever the runner runs items, this process
or Dask workers (`release run --workers N | --cluster ADDR`). Encoding and the same-size clustering
need every record at once and stay on the coordinator; the batches are fixed before they are handed
out and each runs on one thread, so the released averages are the same bytes whatever the number
of workers."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from synth.mechanisms.ksalsa.averaging import OptimisationTrace, optimise_batch
from synth.mechanisms.ksalsa.codec import LatentCodec
from synth.mechanisms.ksalsa.config import KSalsaConfig
from synth.mechanisms.ksalsa.style import StyleContentNet

LABEL = "k-SALSA optimisation (cluster batches)"


@dataclass(frozen=True)
class ClusterJob:
    """What every batch shares: the settings and the public-data codec (pickled to each worker
    with its weights; `codec_sha256` names them, so a resumed run with another codec starts its
    batches afresh)."""

    config: KSalsaConfig
    codec_sha256: str
    codec: LatentCodec = field(repr=False, compare=False)

    @classmethod
    def of(cls, config: KSalsaConfig, codec: LatentCodec) -> ClusterJob:
        return cls(config, weights_sha256(codec), codec)


def weights_sha256(codec: LatentCodec) -> str:
    state = codec.state_dict() if isinstance(codec, torch.nn.Module) else {}
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state.items()}, buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


_NETS: dict[tuple, StyleContentNet] = {}  # one style/content network per process and setting


def _net_key(config: KSalsaConfig) -> tuple:
    return (config.resolved_device(), config.feature_size, tuple(config.style_layers))


@contextmanager
def own_net(config: KSalsaConfig, net: StyleContentNet | None) -> Iterator[None]:
    """Within the block, this process's batches under `config` use `net` (a caller's own network;
    None: the built one); the earlier choice is restored after it."""
    key = _net_key(config)
    before = _NETS.get(key)
    if net is not None:
        _NETS[key] = net
    try:
        yield
    finally:
        if net is not None:
            if before is None:
                _NETS.pop(key, None)
            else:
                _NETS[key] = before


def style_net(config: KSalsaConfig) -> StyleContentNet:
    """The style/content network for `config`, built once per process (public ImageNet weights)."""
    key = _net_key(config)
    if key not in _NETS:
        from synth.mechanisms.ksalsa.style import EfficientNetStyleContent

        _NETS[key] = EfficientNetStyleContent(*key)
    return _NETS[key]


def prepare(config: KSalsaConfig) -> str:
    """Every process that will optimise batches: its network loaded before the first record."""
    return type(style_net(config)).__name__


def average_clusters(
    job: ClusterJob, item: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, OptimisationTrace]:
    """The per-item function (`MECHANISM.per_item`): one batch of B clusters, its members'
    images (B, K, C, H, W) in [-1, 1] and their mean latents (B, D), to B representatives."""
    sources, z0 = item
    device = job.config.resolved_device()
    images, trace = optimise_batch(
        job.codec,
        style_net(job.config),
        torch.from_numpy(np.ascontiguousarray(sources)).to(device),
        torch.from_numpy(np.ascontiguousarray(z0)).to(device),
        job.config,
    )
    return images.cpu().numpy(), trace
