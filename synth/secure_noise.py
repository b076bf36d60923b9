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

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from opacus.optimizers.optimizer import DPOptimizer, _check_processed_flag, _mark_as_processed

SUMMED_NORMALS = 4  # Holohan & Braghin's 2n with n = 2, as opacus' secure mode
_MASK53 = (1 << 53) - 1
_CHUNK = 1 << 17  # noise values per keystream call (4 MiB of keystream): the buffers below stay in cache


class SecureGaussian:
    """N(0, std^2) samples from an AES-CTR keystream; a fresh random key per instance.

    Only the keystream is made on the CPU (OpenSSL AES); the raw 64-bit words go to the target device, where
    the conversion to uniforms and Box-Muller run in place in a workspace kept between draws. Fresh
    32 MiB tensors per draw cost more in page faults than the AES and the arithmetic together."""

    def __init__(self) -> None:
        key, counter = os.urandom(32), os.urandom(16)
        self._stream = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
        self._zeros, self._keystream = b"", bytearray()
        self._workspace: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __reduce__(self) -> Any:  # pickling (torch.save, deepcopy) would write the key out
        raise TypeError("SecureGaussian holds a secret key and cannot be saved or copied; make a new one.")

    def _buffers(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(n float64 values, n // 2 + 1 float64 values) of scratch space on `device`."""
        work, half = self._workspace.get(device, (None, None))
        if work is None or work.numel() < n:
            work = torch.empty(n, dtype=torch.float64, device=device)
            half = torch.empty(n // 2 + 1, dtype=torch.float64, device=device)
            self._workspace[device] = work, half
        return work[:n], half

    def _uniform_into(self, out: torch.Tensor) -> torch.Tensor:
        """Fill float64 `out` with uniforms in (0, 1), 53 random bits each (never 0, so log() is safe)."""
        n = out.numel()
        nbytes = 8 * n
        if len(self._zeros) < nbytes:
            self._zeros, self._keystream = bytes(nbytes), bytearray(nbytes + 15)  # CTR writes len(data); API: +15
        self._stream.update_into(memoryview(self._zeros)[:nbytes], self._keystream)
        words = torch.frombuffer(self._keystream, dtype=torch.int64, count=n)
        if out.device.type == "cpu":
            words.bitwise_and_(_MASK53)  # the low 53 bits of a random word are uniform
            out.copy_(words)
        else:  # ship the words, convert on the device
            out.copy_(words.to(out.device).bitwise_and_(_MASK53))
        return out.add_(0.5).mul_(2.0 ** -53)

    def uniform(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """n float64 uniforms in (0, 1), 53 random bits each."""
        out = torch.empty(n, dtype=torch.float64, device=device)
        for start in range(0, n, _CHUNK):
            self._uniform_into(out[start:start + _CHUNK])
        return out

    def _normals(self, n: int, device: torch.device) -> torch.Tensor:
        """n (even, <= 4 x _CHUNK) float64 N(0, 1) samples by Box-Muller, in the workspace: valid until
        the next draw."""
        pairs = n // 2
        u, cos = self._buffers(n, device)
        self._uniform_into(u)
        r, theta = u[:pairs].log_().mul_(-2.0).sqrt_(), u[pairs:].mul_(2.0 * math.pi)
        torch.cos(theta, out=cos[:pairs])
        theta.sin_().mul_(r)
        r.mul_(cos[:pairs])
        return u  # [r cos(theta), r sin(theta)]

    def standard_normal(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """n float64 N(0, 1) samples (both outputs of each Box-Muller pair used)."""
        out, device = torch.empty(n, dtype=torch.float64, device=device), torch.device(device)
        for start in range(0, n, 2 * _CHUNK):
            m = min(2 * _CHUNK, n - start)
            out[start:start + m] = self._normals(m + m % 2, device)[:m]
        return out

    def noise(self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu") -> torch.Tensor:
        """float64 N(0, std^2) noise of `shape`: the sum of 4 normals of std `std`, halved."""
        n, device = math.prod(shape), torch.device(device)
        total = torch.empty(n, dtype=torch.float64, device=device)
        for start in range(0, n, _CHUNK):
            m = min(_CHUNK, n - start)
            draws = self._normals(SUMMED_NORMALS * m, device).view(SUMMED_NORMALS, m)
            torch.sum(draws, 0, out=total[start:start + m])
        return total.mul_(std / math.sqrt(SUMMED_NORMALS)).reshape(shape)


def _secure_add_noise(self: DPOptimizer) -> None:
    """DPOptimizer.add_noise with the secure generator (rank 0 only under DPDDP, as opacus does). One draw
    for all parameters of a device: one keystream call instead of one per tensor."""
    noisy = getattr(self, "rank", 0) == 0
    grads = [p.summed_grad for p in self.params]
    for g in grads:
        _check_processed_flag(g)
    noises = noise_like(self.secure_gaussian, grads, self.noise_multiplier * self.max_grad_norm) if noisy else None
    for i, (p, g) in enumerate(zip(self.params, grads, strict=True)):
        p.grad = ((g.to(torch.float64) + noises[i]).to(g.dtype) if noisy else g).view_as(p)
        _mark_as_processed(g)


def noise_like(gen: SecureGaussian, tensors: list[torch.Tensor], std: float) -> list[torch.Tensor]:
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for device in {t.device for t in tensors}:
        idx = [i for i, t in enumerate(tensors) if t.device == device]
        flat = gen.noise((sum(tensors[i].numel() for i in idx),), std, device)
        for i, chunk in zip(idx, torch.split(flat, [tensors[i].numel() for i in idx]), strict=True):
            out[i] = chunk.view(tensors[i].shape)
    return out


def install(optimizer: DPOptimizer) -> DPOptimizer:
    """Make an opacus DPOptimizer draw its DP noise from a fresh SecureGaussian (this instance only)."""
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"secure noise plugs into an opacus DPOptimizer, got {type(optimizer).__name__}")
    optimizer.secure_gaussian = SecureGaussian()
    optimizer.add_noise = types.MethodType(_secure_add_noise, optimizer)
    return optimizer
