"""Gaussian noise for DP-SGD from a cryptographically secure generator, hardened against the
floating-point attack on Gaussian sampling.

opacus' own secure mode needs torchcsprng, which does not install with our torch. This module
gives the same protection with the `cryptography` package:

* Randomness: an AES-256-CTR keystream (the key and the initial counter from os.urandom; 2^128
  blocks before the counter wraps). Nobody who lacks the key can predict or reproduce the noise,
  even knowing the seed in the release config, and the key lives only in this process: the
  generator refuses to be pickled, so it can never land in a checkpoint.
* Sampling: 53-bit uniform doubles in (0, 1) -> Box-Muller in float64.
* The floating-point attack (Jin et al. 2021, "Are we there yet? Timing and floating-point attacks
  on differential privacy systems"; Mironov 2012 for Laplace): a float Gaussian sample's low-order
  bits reveal which values it can have come from, so the noisy output can leak the un-noised value.
  The defence opacus' secure mode uses (Holohan & Braghin 2021, "Secure random sampling in
  differential privacy", §5.1, n = 2): draw 2n = 4 normals of std sigma and return their sum / 2
  (std sigma again), which makes the attack cost about 2^(53(2n-1)) = 2^159 work. We also add the
  noise to the gradient in float64 and round only the noisy sum to the parameter's precision
  (rounding after the noise is post-processing).

What it does not protect against: timing side channels of the training process, a compromised host
(the key is in its memory while training), and anything outside the noise (the accountant's
assumptions, the data pipeline).
"""
from __future__ import annotations

import math
import os
import types
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from opacus.optimizers.optimizer import DPOptimizer, _check_processed_flag, _mark_as_processed

SUMMED_NORMALS = 4  # Holohan & Braghin's 2n with n = 2, as opacus' secure mode
_MASK53 = (1 << 53) - 1


class SecureGaussian:
    """N(0, std^2) samples from an AES-CTR keystream; a fresh random key per instance."""

    def __init__(self) -> None:
        key, counter = os.urandom(32), os.urandom(16)
        self._stream = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()

    def __reduce__(self) -> Any:  # pickling (torch.save, deepcopy) would write the key out
        raise TypeError("SecureGaussian holds a secret key and cannot be saved or copied; make a new one.")

    def uniform(self, n: int) -> torch.Tensor:
        """n float64 uniforms in (0, 1), 53 random bits each (never 0, so log() is safe)."""
        raw = self._stream.update(bytes(8 * n))
        bits = torch.from_numpy(np.frombuffer(raw, dtype=np.int64).copy())
        return ((bits >> 11) & _MASK53).to(torch.float64).add_(0.5).mul_(2.0 ** -53)

    def standard_normal(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """n float64 N(0, 1) samples by Box-Muller (both outputs of each pair used)."""
        pairs = (n + 1) // 2
        u = self.uniform(2 * pairs).to(device)
        r = torch.sqrt(-2.0 * torch.log(u[:pairs]))
        theta = (2.0 * math.pi) * u[pairs:]
        return torch.cat((r * torch.cos(theta), r * torch.sin(theta)))[:n]

    def noise(self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu") -> torch.Tensor:
        """float64 N(0, std^2) noise of `shape`: the sum of 4 normals of std `std`, halved."""
        n = math.prod(shape)
        total = torch.zeros(n, dtype=torch.float64, device=device)
        for _ in range(SUMMED_NORMALS):
            total += self.standard_normal(n, device)
        return (total * (std / math.sqrt(SUMMED_NORMALS))).reshape(shape)


def _secure_add_noise(self: DPOptimizer) -> None:
    """DPOptimizer.add_noise with the secure generator (rank 0 only under DPDDP, as opacus does). One draw
    for all parameters of a device: one keystream call instead of one per tensor."""
    noisy = getattr(self, "rank", 0) == 0
    grads = [p.summed_grad for p in self.params]
    for g in grads:
        _check_processed_flag(g)
    noises = noise_like(self.secure_gaussian, grads, self.noise_multiplier * self.max_grad_norm) if noisy else None
    for i, (p, g) in enumerate(zip(self.params, grads)):
        p.grad = ((g.to(torch.float64) + noises[i]).to(g.dtype) if noisy else g).view_as(p)
        _mark_as_processed(g)


def noise_like(gen: SecureGaussian, tensors: list[torch.Tensor], std: float) -> list[torch.Tensor]:
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for device in {t.device for t in tensors}:
        idx = [i for i, t in enumerate(tensors) if t.device == device]
        flat = gen.noise((sum(tensors[i].numel() for i in idx),), std, device)
        for i, chunk in zip(idx, torch.split(flat, [tensors[i].numel() for i in idx])):
            out[i] = chunk.view(tensors[i].shape)
    return out


def install(optimizer: DPOptimizer) -> DPOptimizer:
    """Make an opacus DPOptimizer draw its DP noise from a fresh SecureGaussian (this instance only)."""
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"secure noise plugs into an opacus DPOptimizer, got {type(optimizer).__name__}")
    optimizer.secure_gaussian = SecureGaussian()
    optimizer.add_noise = types.MethodType(_secure_add_noise, optimizer)
    return optimizer
