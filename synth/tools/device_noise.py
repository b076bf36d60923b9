"""Secure DP-SGD noise made where the gradients are: a ChaCha20 keystream (RFC 8439) computed with
torch integer tensor ops on the tensors' device, then the same 53-bit uniforms, Box-Muller and sum
of 4 normals as synth/tools/secure_noise.py's AES path, without the host's keystream or a
host-to-device
copy per step.

* Cipher: the ChaCha20 block function of RFC 8439 §2.3 (20 rounds, 32-bit words). torch has no
  unsigned 32-bit arithmetic on every device, so the words are int64 holding values in [0, 2^32),
  masked after each addition and left shift. Every block of a generator is distinct: a fresh 256-bit
  key and 96-bit nonce from os.urandom per instance, and a 64-bit block counter (RFC 8439's 32-bit
  counter word, its carry added to the first nonce word: block c has counter c mod 2^32 and nonce
  word n0 + floor(c / 2^32), distinct for every c) that only moves forward; a generator that would
  pass 2^63 blocks refuses to.
* Uniforms: the keystream read as little-endian 64-bit words, the low 53 bits of each -> (k + 1/2)
  2^-53, as SecureGaussian does with its AES keystream (tested equal to that formula over
  `cryptography`'s ChaCha20).
* The key stays in this process (on the device): the generator refuses to be pickled or copied.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from synth.tools.secure_noise import SecureGaussian

_M32 = 0xFFFFFFFF
_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_LOW21 = (1 << 21) - 1  # the high word's share of a 53-bit uniform
MAX_BLOCKS = 1 << 63  # counters stay non-negative int64 (2^69 bytes of keystream per generator)


def _words(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def _rotl_(x: torch.Tensor, n: int) -> torch.Tensor:
    high = x >> (32 - n)
    return x.bitwise_left_shift_(n).bitwise_and_(_M32).bitwise_or_(high)


def _quarter_rounds(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> None:
    """RFC 8439 §2.1 on four rows of words at once (each row [4, blocks]), in place."""
    a.add_(b).bitwise_and_(_M32)
    _rotl_(d.bitwise_xor_(a), 16)  # noqa: E702
    c.add_(d).bitwise_and_(_M32)
    _rotl_(b.bitwise_xor_(c), 12)  # noqa: E702
    a.add_(b).bitwise_and_(_M32)
    _rotl_(d.bitwise_xor_(a), 8)  # noqa: E702
    c.add_(d).bitwise_and_(_M32)
    _rotl_(b.bitwise_xor_(c), 7)  # noqa: E702


def chacha20_blocks(key: torch.Tensor, nonce: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """ChaCha20 blocks (RFC 8439 §2.3) as int64 words in [0, 2^32), shape [len(counters), 16], on
    counters' device.

    `key`: 8 words, `nonce`: 3 words (int64, little-endian word order of the RFC's byte strings),
    `counters`: int64 64-bit block numbers; the low 32 bits are the RFC's counter word, the high
    ones are added to the first nonce word (so counters below 2^32 give exactly RFC 8439's
    blocks)."""
    n, device = counters.numel(), counters.device
    init = torch.empty(16, n, dtype=torch.int64, device=device)
    init[0:4] = torch.tensor(_SIGMA, dtype=torch.int64, device=device)[:, None]
    init[4:12] = key.to(device)[:, None]
    init[12] = counters & _M32
    init[13] = (nonce[0].to(device) + (counters >> 32)) & _M32
    init[14:16] = nonce[1:3].to(device)[:, None]
    x = init.clone().view(4, 4, n)
    a, b, c, d = x[0], x[1], x[2], x[3]
    for _ in range(10):
        _quarter_rounds(a, b, c, d)  # column round
        b2, c2, d2 = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)  # diagonals become columns
        _quarter_rounds(a, b2, c2, d2)
        b.copy_(b2.roll(1, 0)), c.copy_(c2.roll(2, 0)), d.copy_(d2.roll(3, 0))
    return x.view(16, n).add_(init).bitwise_and_(_M32).t()


def _checked_compile(
    key: torch.Tensor, nonce: torch.Tensor, counters: torch.Tensor
) -> Callable[..., torch.Tensor]:
    """torch.compile'd chacha20_blocks if it compiles and agrees with the eager function on
    `counters`' blocks."""
    try:
        fast = torch.compile(chacha20_blocks, dynamic=False)
        if torch.equal(fast(key, nonce, counters), chacha20_blocks(key, nonce, counters)):
            return fast
        warnings.warn(
            "torch.compile'd ChaCha20 disagrees with the eager one: using the eager one.",
            stacklevel=3,
        )
    except Exception as exc:  # no compiler toolchain (triton, a C++ compiler) on this machine
        warnings.warn(
            f"torch.compile of ChaCha20 failed ({type(exc).__name__}): using the eager one.",
            stacklevel=3,
        )
    return chacha20_blocks


class ChaChaGaussian(SecureGaussian):
    """N(0, std^2) samples as SecureGaussian's, from a ChaCha20 keystream computed on the target
    device.

    `noise`, `standard_normal` and `uniform` are SecureGaussian's (Box-Muller in float64, the sum of
    4 normals); only where the 53-bit uniforms come from differs. `chunk` noise values are made per
    keystream call (larger on a GPU, where each call is ~600 kernel launches). With `compiled`, the
    block function goes through torch.compile (one fused kernel instead of ~600 memory-bound ones;
    its first blocks are checked against the eager function once, and a compiler that fails or
    disagrees leaves the eager one in use, with a warning)."""

    def __init__(self, chunk: int | None = None, compiled: bool = False) -> None:
        self._key, self._nonce = _words(os.urandom(32)), _words(os.urandom(12))
        self._blocks: Callable[..., torch.Tensor] | None = None if compiled else chacha20_blocks
        self._position = 0  # blocks used so far
        self._key_on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._workspace = {}
        self._chunk = chunk

    def __reduce__(self) -> Any:
        raise TypeError(
            "ChaChaGaussian holds a secret key and cannot be saved or copied; make a new one."
        )

    def _chunk_for(self, device: torch.device) -> int:
        if self._chunk is not None:
            return self._chunk
        return 1 << 20 if device.type == "cuda" else super()._chunk_for(device)

    def keystream_words(self, blocks: int, device: torch.device | str) -> torch.Tensor:
        """The next `blocks` x 16 keystream words (int64 in [0, 2^32)) in keystream order, never
        repeated."""
        device = torch.device(device)
        if self._position + blocks > MAX_BLOCKS:
            raise RuntimeError(
                "ChaChaGaussian: 2^63 blocks used, its counter would repeat; make a new generator."
            )
        if device not in self._key_on:
            self._key_on[device] = (
                torch.tensor(self._key, dtype=torch.int64, device=device),
                torch.tensor(self._nonce, dtype=torch.int64, device=device),
            )
        key, nonce = self._key_on[device]
        counters = torch.arange(
            self._position, self._position + blocks, dtype=torch.int64, device=device
        )
        self._position += blocks
        if self._blocks is None:
            self._blocks = _checked_compile(key, nonce, counters)
        return self._blocks(key, nonce, counters).reshape(-1)

    def _uniform_into(self, out: torch.Tensor) -> torch.Tensor:
        """Fill float64 `out` with uniforms in (0, 1) from the keystream: the low 53 bits of each
        little-endian 64-bit word (two 32-bit words: low, high), as SecureGaussian reads its AES
        keystream."""
        n = out.numel()
        words = self.keystream_words(-(-n // 8), out.device)[: 2 * n].view(n, 2)
        bits = words[:, 1].bitwise_and_(_LOW21).bitwise_left_shift_(32).bitwise_or_(words[:, 0])
        out.copy_(bits)
        return out.add_(0.5).mul_(2.0**-53)
