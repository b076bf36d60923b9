"""Latent codec: an encoder E and a generator G with G(E(x)) ~ x, trained on PUBLIC images only.

Any pair with `encode`/`decode` works (e.g. StyleGAN2 + ReStyle on a GPU); the default is a compact
conv autoencoder trained here and cached in the work directory, keyed by a hash of the public data
and the codec settings, so a second run reuses it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from accounting.errors import DataFormatError, InvalidParameterError
from synth.kinds.datasets import ImageDataset, conform
from synth.mechanisms.ksalsa.config import KSalsaConfig
from synth.progress import ProgressFn, no_progress

CODEC_VERSION = "conv-ae-v1"


@runtime_checkable
class LatentCodec(Protocol):
    """Images are [-1, 1], channels first (N, C, H, W); latents are (N, D). `decode` must be
    differentiable in z (k-SALSA optimises the latent through it)."""

    def encode(self, x_pm1: torch.Tensor) -> torch.Tensor: ...

    def decode(self, z: torch.Tensor) -> torch.Tensor: ...


class ConvAutoencoder(nn.Module):
    """Two stride-2 convolutions down to (64, H/4, W/4), a linear bottleneck of `latent_dim`,
    mirrored up."""

    def __init__(self, channels: int, size: int, latent_dim: int):
        super().__init__()
        if size % 4:
            raise InvalidParameterError(
                f"The conv codec needs an image size divisible by 4; got {size}. Set image_size."
            )
        self.channels, self.size, self.latent_dim = channels, size, latent_dim
        s = size // 4
        self.enc = nn.Sequential(
            nn.Conv2d(channels, 32, 4, 2, 1),
            nn.SiLU(),
            nn.Conv2d(32, 64, 4, 2, 1),
            nn.SiLU(),
            nn.Flatten(),
            nn.Linear(64 * s * s, latent_dim),
        )
        self.dec_in = nn.Linear(latent_dim, 64 * s * s)
        self.dec = nn.Sequential(
            nn.SiLU(),
            nn.ConvTranspose2d(64, 32, 4, 2, 1),
            nn.SiLU(),
            nn.ConvTranspose2d(32, channels, 4, 2, 1),
            nn.Tanh(),
        )

    def encode(self, x_pm1: torch.Tensor) -> torch.Tensor:
        return self.enc(x_pm1)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        s = self.size // 4
        return self.dec(self.dec_in(z).view(-1, 64, s, s))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    @property
    def description(self) -> str:
        return (
            f"conv autoencoder ({CODEC_VERSION}), latent {self.latent_dim}, "
            f"{self.channels}x{self.size}x{self.size}"
        )


def codec_cache_key(public: ImageDataset, size: int, channels: int, config: KSalsaConfig) -> str:
    """Public data may be hashed in plain (it is public); the key also covers every codec
    setting."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(public.images).tobytes())
    h.update(str(public.images.shape).encode())
    h.update(
        json.dumps(
            {"version": CODEC_VERSION, "size": size, "channels": channels, **config.codec_key()},
            sort_keys=True,
        ).encode()
    )
    return h.hexdigest()[:20]


def train_codec(
    public: ImageDataset,
    workdir: Path,
    config: KSalsaConfig,
    progress: ProgressFn = no_progress,
    *,
    size: int = 28,
    channels: int = 1,
) -> ConvAutoencoder:
    """Train (or load from workdir) the default conv autoencoder on the public images, at
    `size` x `size` with `channels` channels (those of the sensitive set)."""
    if len(public) < 2:
        raise DataFormatError(
            f"The public set {public.source!r} has {len(public)} image(s); the codec needs more."
        )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    key = codec_cache_key(public, size, channels, config)
    path = workdir / f"ksalsa-codec-{key}.pt"
    device = config.resolved_device()
    model = ConvAutoencoder(channels, size, config.latent_dim)
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        progress("codec (cached)", 1, 1)
        return _frozen(model.to(device))

    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    x = torch.from_numpy(conform(public, size, channels))
    model = model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=config.codec_lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, config.codec_epochs))
    for epoch in range(config.codec_epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), config.codec_batch):
            batch = x[perm[i : i + config.codec_batch]].to(device)
            loss = F.mse_loss(model(batch), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
        progress("codec training", epoch + 1, config.codec_epochs)
    model.eval()
    tmp = path.with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)  # atomic: a crashed run never leaves a half-written cache entry
    return _frozen(model)


def _frozen(model: ConvAutoencoder) -> ConvAutoencoder:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def describe_codec(codec: LatentCodec) -> str:
    return str(getattr(codec, "description", type(codec).__name__))


@torch.no_grad()
def encode_all(codec: LatentCodec, x: torch.Tensor, device: str, batch: int = 512) -> torch.Tensor:
    return torch.cat(
        [codec.encode(x[i : i + batch].to(device)).float().cpu() for i in range(0, len(x), batch)]
    )
