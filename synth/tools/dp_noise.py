"""The DP-SGD noise plugged into opacus: `install` makes a DPOptimizer draw its noise from secure
generators: SecureGaussian (synth/tools/secure_noise.py, OpenSSL's AES keystream on the host, copied
to
the device) by default, ChaChaGaussian (synth/tools/device_noise.py, a ChaCha20 keystream computed
on
the device) where asked for.

Why AES on a GPU too: on an H100 (2026-11-27, UNet [32, 64, 64], batch 500; BENCHMARKS.md, "GPU
lease of 2026-11-27") the product's whole DP-SGD loop took 127 ms a step with the host's AES noise
and 167 ms with ChaCha20 in eager torch ops on the device (113 ms with torch's insecure generator):
the keystream's many small integer kernels cost more than the host's OpenSSL plus one copy."""

from __future__ import annotations

import types
from typing import Any

import torch
from opacus.optimizers.optimizer import DPOptimizer, _check_processed_flag, _mark_as_processed

from synth.tools.device_noise import ChaChaGaussian
from synth.tools.secure_noise import SecureGaussian


def _secure_add_noise(self: DPOptimizer) -> None:
    """DPOptimizer.add_noise with the secure generator (rank 0 only under DPDDP, as opacus does).
    One draw for all parameters of a device: one keystream call instead of one per tensor."""
    noisy = getattr(self, "rank", 0) == 0
    grads = [p.summed_grad for p in self.params]
    for g in grads:
        _check_processed_flag(g)
    noises = (
        noise_like(self.secure_gaussian, grads, self.noise_multiplier * self.max_grad_norm)
        if noisy
        else None
    )
    for i, (p, g) in enumerate(zip(self.params, grads, strict=True)):
        p.grad = (
            (g.to(torch.float64) + noises[i]).to(g.dtype) if noises is not None else g
        ).view_as(p)
        _mark_as_processed(g)


PATHS = ("auto", "aes", "chacha")


class SecureNoise:
    """The secure generator for each device: "auto" (the default) and "aes" draw every device's
    noise from SecureGaussian (OpenSSL's AES keystream, the fastest of the secure generators on a
    CPU and a GPU: module docstring, BENCHMARKS.md); "chacha" from
    synth.tools.device_noise.ChaChaGaussian (a ChaCha20 keystream computed on the noise's device,
    no host work or copy per draw). Each generator gets its own
    fresh key on first use; none can be saved."""

    def __init__(self, path: str = "auto") -> None:
        if path not in PATHS:
            raise ValueError(f"secure noise path must be one of {PATHS}, got {path!r}.")
        self.path = path
        self._generators: dict[str, SecureGaussian] = {}

    def __reduce__(self) -> Any:
        raise TypeError(
            "SecureNoise holds secret keys and cannot be saved or copied; make a new one."
        )

    def generator_for(self, device: torch.device | str) -> SecureGaussian:
        kind = "aes" if self.path == "auto" else self.path
        if kind not in self._generators:
            self._generators[kind] = SecureGaussian() if kind == "aes" else ChaChaGaussian()
        return self._generators[kind]

    def noise(
        self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        return self.generator_for(device).noise(shape, std, device)


def noise_like(
    gen: SecureGaussian | SecureNoise, tensors: list[torch.Tensor], std: float
) -> list[torch.Tensor]:
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for device in {t.device for t in tensors}:
        idx = [i for i, t in enumerate(tensors) if t.device == device]
        flat = gen.noise((sum(tensors[i].numel() for i in idx),), std, device)
        for i, chunk in zip(idx, torch.split(flat, [tensors[i].numel() for i in idx]), strict=True):
            out[i] = chunk.view(tensors[i].shape)
    # every index was filled: each tensor is on one of the devices
    return [t for t in out if t is not None]


def install(optimizer: DPOptimizer, path: str = "auto") -> DPOptimizer:
    """Make an opacus DPOptimizer draw its DP noise from fresh secure generators (this instance
    only): by `path` (SecureNoise), the AES keystream for CPU tensors and ChaCha20 on the device for
    GPU tensors."""
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(
            f"secure noise plugs into an opacus DPOptimizer, got {type(optimizer).__name__}"
        )
    optimizer.secure_gaussian = SecureNoise(path)
    optimizer.add_noise = types.MethodType(_secure_add_noise, optimizer)
    return optimizer
