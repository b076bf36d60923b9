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

The same uniforms, Box-Muller and sum can come from a ChaCha20 keystream computed on a GPU itself
(synth/tools/device_noise.py; synth/tools/dp_noise.py's `SecureNoise("chacha")`); the default is
this module's
AES keystream on every device, which was faster in an H100's DP-SGD loop (synth/tools/dp_noise.py).

What it does not protect against: timing side channels of the training process, a compromised host
(the key is in its memory while training), and anything outside the noise (the accountant's
assumptions, the data pipeline).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SUMMED_NORMALS = 4  # Holohan & Braghin's 2n with n = 2, as opacus' secure mode
_MASK53 = (1 << 53) - 1
# noise values per keystream call (4 MiB of keystream): the buffers below stay in cache
_CHUNK = 1 << 17


class SecureGaussian:
    """N(0, std^2) samples from an AES-CTR keystream; a fresh random key per instance.

    Only the keystream is made on the CPU (OpenSSL AES); the raw 64-bit words go to the target
    device, where the conversion to uniforms and Box-Muller run in place in a workspace kept between
    draws. Fresh 32 MiB tensors per draw cost more in page faults than the AES and the arithmetic
    together."""

    def __init__(self) -> None:
        key, counter = os.urandom(32), os.urandom(16)
        self._stream = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
        self._zeros, self._keystream = b"", bytearray()
        self._workspace: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __reduce__(self) -> Any:  # pickling (torch.save, deepcopy) would write the key out
        raise TypeError(
            "SecureGaussian holds a secret key and cannot be saved or copied; make a new one."
        )

    def _buffers(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(n float64 values, n // 2 + 1 float64 values) of scratch space on `device`."""
        cached = self._workspace.get(device)
        if cached is None or cached[0].numel() < n:
            cached = (
                torch.empty(n, dtype=torch.float64, device=device),
                torch.empty(n // 2 + 1, dtype=torch.float64, device=device),
            )
            self._workspace[device] = cached
        work, half = cached
        return work[:n], half

    def _uniform_into(self, out: torch.Tensor) -> torch.Tensor:
        """Fill float64 `out` with uniforms in (0, 1), 53 random bits each (never 0, so log() is
        safe)."""
        n = out.numel()
        nbytes = 8 * n
        if len(self._zeros) < nbytes:
            # CTR writes len(data); API: +15
            self._zeros, self._keystream = (
                bytes(nbytes),
                bytearray(nbytes + 15),
            )
        self._stream.update_into(memoryview(self._zeros)[:nbytes], self._keystream)
        words = torch.frombuffer(self._keystream, dtype=torch.int64, count=n)
        if out.device.type == "cpu":
            words.bitwise_and_(_MASK53)  # the low 53 bits of a random word are uniform
            out.copy_(words)
        else:  # ship the words, convert on the device
            out.copy_(words.to(out.device).bitwise_and_(_MASK53))
        return out.add_(0.5).mul_(2.0**-53)

    def _chunk_for(self, device: torch.device) -> int:
        """Noise values per keystream call on `device`."""
        return _CHUNK

    def uniform(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """n float64 uniforms in (0, 1), 53 random bits each."""
        out = torch.empty(n, dtype=torch.float64, device=device)
        chunk = self._chunk_for(out.device)
        for start in range(0, n, chunk):
            self._uniform_into(out[start : start + chunk])
        return out

    def _normals(self, n: int, device: torch.device) -> torch.Tensor:
        """n (even, <= 4 x chunk) float64 N(0, 1) samples by Box-Muller, in the workspace: valid
        until the next draw."""
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
            out[start : start + m] = self._normals(m + m % 2, device)[:m]
        return out

    def noise(
        self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """float64 N(0, std^2) noise of `shape`: the sum of 4 normals of std `std`, halved."""
        n, device = math.prod(shape), torch.device(device)
        total, chunk = torch.empty(n, dtype=torch.float64, device=device), self._chunk_for(device)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            draws = self._normals(SUMMED_NORMALS * m, device).view(SUMMED_NORMALS, m)
            torch.sum(draws, 0, out=total[start : start + m])
        return total.mul_(std / math.sqrt(SUMMED_NORMALS)).reshape(shape)
