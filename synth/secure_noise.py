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

Where the gradients live on a GPU, the same uniforms, Box-Muller and sum come from a ChaCha20 keystream computed
on the device itself (synth/device_noise.py; `SecureNoise` picks the generator by device), so no keystream is made
on the host or copied per step.

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

    def _chunk_for(self, device: torch.device) -> int:
        """Noise values per keystream call on `device`."""
        return _CHUNK

    def uniform(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """n float64 uniforms in (0, 1), 53 random bits each."""
        out = torch.empty(n, dtype=torch.float64, device=device)
        chunk = self._chunk_for(out.device)
        for start in range(0, n, chunk):
            self._uniform_into(out[start:start + chunk])
        return out

    def _normals(self, n: int, device: torch.device) -> torch.Tensor:
        """n (even, <= 4 x chunk) float64 N(0, 1) samples by Box-Muller, in the workspace: valid until
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
        chunk = self._chunk_for(device)
        for start in range(0, n, 2 * chunk):
            m = min(2 * chunk, n - start)
            out[start:start + m] = self._normals(m + m % 2, device)[:m]
        return out

    def noise(self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu") -> torch.Tensor:
        """float64 N(0, std^2) noise of `shape`: the sum of 4 normals of std `std`, halved."""
        n, device = math.prod(shape), torch.device(device)
        total, chunk = torch.empty(n, dtype=torch.float64, device=device), self._chunk_for(device)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
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


PATHS = ("auto", "aes", "chacha")


class SecureNoise:
    """The secure generator for each device: "auto" (the default) draws CPU tensors' noise from SecureGaussian
    (OpenSSL's AES keystream) and any other device's from synth.device_noise.ChaChaGaussian (a ChaCha20
    keystream computed on that device, no host work or copy per draw); "aes" or "chacha" use one for all.
    Each generator gets its own fresh key on first use; none can be saved."""

    def __init__(self, path: str = "auto") -> None:
        if path not in PATHS:
            raise ValueError(f"secure noise path must be one of {PATHS}, got {path!r}.")
        self.path = path
        self._generators: dict[str, SecureGaussian] = {}

    def __reduce__(self) -> Any:
        raise TypeError("SecureNoise holds secret keys and cannot be saved or copied; make a new one.")

    def generator_for(self, device: torch.device | str) -> SecureGaussian:
        kind = self.path if self.path != "auto" else ("aes" if torch.device(device).type in ("cpu", "meta")
                                                      else "chacha")
        if kind not in self._generators:
            from synth.device_noise import (
                ChaChaGaussian,  # it subclasses SecureGaussian: imported late
            )

            self._generators[kind] = SecureGaussian() if kind == "aes" else ChaChaGaussian()
        return self._generators[kind]

    def noise(self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.generator_for(device).noise(shape, std, device)


def noise_like(gen: SecureGaussian | SecureNoise, tensors: list[torch.Tensor], std: float) -> list[torch.Tensor]:
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for device in {t.device for t in tensors}:
        idx = [i for i, t in enumerate(tensors) if t.device == device]
        flat = gen.noise((sum(tensors[i].numel() for i in idx),), std, device)
        for i, chunk in zip(idx, torch.split(flat, [tensors[i].numel() for i in idx]), strict=True):
            out[i] = chunk.view(tensors[i].shape)
    return out


def install(optimizer: DPOptimizer, path: str = "auto") -> DPOptimizer:
    """Make an opacus DPOptimizer draw its DP noise from fresh secure generators (this instance only): by
    `path` (SecureNoise), the AES keystream for CPU tensors and ChaCha20 on the device for GPU tensors."""
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"secure noise plugs into an opacus DPOptimizer, got {type(optimizer).__name__}")
    optimizer.secure_gaussian = SecureNoise(path)
    optimizer.add_noise = types.MethodType(_secure_add_noise, optimizer)
    return optimizer
