"""ChaCha20 in torch ops (synth/tools/device_noise.py): RFC 8439's vectors, `cryptography`'s ChaCha20, the uniforms as the
AES path forms them, a counter that never repeats, and the generator picked by device for opacus' noise.
The statistical tests of the noise itself run on both paths in test_secure_noise.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from opacus.optimizers import DPOptimizer

from synth.tools import device_noise
from synth.tools.device_noise import ChaChaGaussian, chacha20_blocks
from synth.tools.dp_noise import SecureNoise, install
from synth.tools.secure_noise import SecureGaussian

RFC_KEY = bytes(range(32))


def _blocks(key: bytes, nonce: bytes, counters: list[int]) -> bytes:
    words = chacha20_blocks(
        torch.tensor(device_noise._words(key)),
        torch.tensor(device_noise._words(nonce)),
        torch.tensor(counters, dtype=torch.int64),
    )
    return words.to(torch.int64).numpy().astype("<u4").tobytes()


def _openssl(key: bytes, nonce: bytes, counter: int, nbytes: int) -> bytes:
    """cryptography's ChaCha20: its 16-byte nonce is the 4-byte little-endian counter, then the 12-byte nonce."""
    return (
        Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce), None)
        .encryptor()
        .update(bytes(nbytes))
    )


def test_rfc8439_block_function_vector() -> None:
    """RFC 8439 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block count 1."""
    expected = bytes.fromhex(
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    assert _blocks(RFC_KEY, bytes.fromhex("000000090000004a00000000"), [1]) == expected


def test_rfc8439_encryption_vector() -> None:
    """RFC 8439 §2.4.2: the 114-byte "sunscreen" plaintext from block count 1 (two blocks of keystream)."""
    plaintext = (
        b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
        b"sunscreen would be it."
    )
    expected = bytes.fromhex(
        "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0bf91b65c5524733ab8f593dabcd62b357"
        "1639d624e65152ab8f530c359f0861d807ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
        "5af90bbf74a35be6b40b8eedf2785e42874d"
    )
    stream = _blocks(RFC_KEY, bytes.fromhex("000000000000004a00000000"), [1, 2])
    assert bytes(p ^ k for p, k in zip(plaintext, stream)) == expected


@pytest.mark.parametrize("start", [0, 7, 2**31 + 5, 2**32 - 40])
def test_keystream_equals_cryptography_chacha20(start: int) -> None:
    key, nonce = os.urandom(32), os.urandom(12)
    assert _blocks(key, nonce, list(range(start, start + 40))) == _openssl(
        key, nonce, start, 64 * 40
    )


def test_past_2_32_blocks_the_carry_goes_into_the_first_nonce_word() -> None:
    """Block c = 2^32 k + j is RFC block j under nonce word n0 + k: distinct blocks for every 64-bit c."""
    key, nonce = os.urandom(32), os.urandom(12)
    n0 = int.from_bytes(nonce[:4], "little")
    carried = ((n0 + 3) % 2**32).to_bytes(4, "little") + nonce[4:]
    assert _blocks(key, nonce, [3 * 2**32 + j for j in range(4)]) == _openssl(
        key, carried, 0, 64 * 4
    )


def test_the_generator_continues_one_keystream_and_never_repeats_a_block() -> None:
    g = ChaChaGaussian()
    key, nonce = (
        b"".join(w.to_bytes(4, "little") for w in g._key),
        b"".join(w.to_bytes(4, "little") for w in g._nonce),
    )
    first, second = g.keystream_words(3, "cpu"), g.keystream_words(5, "cpu")
    got = torch.cat([first, second]).numpy().astype("<u4").tobytes()
    assert got == _openssl(key, nonce, 0, 64 * 8)
    g._position = device_noise.MAX_BLOCKS - 2
    with pytest.raises(RuntimeError, match="counter would repeat"):
        g.keystream_words(3, "cpu")


def test_uniforms_are_the_aes_paths_formula_over_the_chacha20_keystream() -> None:
    """SecureGaussian reads its keystream as little-endian int64 words and keeps the low 53 bits; the device
    path must form the same uniforms from its keystream, bit for bit (odd count: a part-used last block)."""
    g = ChaChaGaussian()
    key, nonce = (
        b"".join(w.to_bytes(4, "little") for w in g._key),
        b"".join(w.to_bytes(4, "little") for w in g._nonce),
    )
    u = g.uniform(1001)
    words = np.frombuffer(_openssl(key, nonce, 0, 8 * 1001), dtype="<u8")
    expected = ((words & np.uint64(2**53 - 1)).astype(np.float64) + 0.5) * 2.0**-53
    assert np.array_equal(u.numpy(), expected)
    assert g._position == -(-1001 // 8)  # the rest of the last block is never reused
    assert g.uniform(8)[0] != u[-1]


def test_secure_noise_picks_the_aes_keystream_on_every_device_unless_told() -> None:
    """AES on the host was faster than ChaCha20 on the device in the H100's DP-SGD loop (127 vs
    167 ms a step): "auto" takes it for a GPU's tensors too."""
    auto = SecureNoise()
    assert type(auto.generator_for("cpu")) is SecureGaussian
    assert (
        type(auto.generator_for(torch.device("cuda", 0))) is SecureGaussian
    )  # no CUDA needed to choose
    assert auto.generator_for("cpu") is auto.generator_for("cpu")  # one key per generator, kept
    assert type(SecureNoise("chacha").generator_for("cpu")) is ChaChaGaussian
    assert type(SecureNoise("aes").generator_for("cuda")) is SecureGaussian
    with pytest.raises(ValueError, match="must be one of"):
        SecureNoise("randn")


def test_opacus_noise_comes_from_the_chosen_path(monkeypatch) -> None:
    """An opacus DPOptimizer step with the ChaCha20 path chosen on the CPU: its noise is drawn by ChaChaGaussian
    (the AES generator never made), with the noise's std on the noised gradient."""
    draws: list[str] = []
    for cls in (SecureGaussian, ChaChaGaussian):
        real = cls._uniform_into
        monkeypatch.setattr(
            cls,
            "_uniform_into",
            lambda self, out, real=real, name=cls.__name__: (draws.append(name), real(self, out))[
                1
            ],
        )
    p = torch.nn.Parameter(torch.zeros(40_000))
    opt = install(
        DPOptimizer(
            torch.optim.SGD([p], lr=1.0),
            noise_multiplier=2.0,
            max_grad_norm=1.5,
            expected_batch_size=1,
        ),
        "chacha",
    )
    p.grad_sample = torch.zeros(1, 40_000)
    opt.step()
    assert set(draws) == {"ChaChaGaussian"}
    assert abs(float(p.detach().std()) - 3.0) < 0.1  # lr 1, batch 1: minus the noise of std 2 x 1.5
    assert isinstance(opt.secure_gaussian, SecureNoise)


def test_a_compiler_that_fails_or_disagrees_leaves_the_eager_block_function(monkeypatch) -> None:
    """ChaChaGaussian(compiled=True) on a machine without a working torch.compile (or with a wrong one) still draws
    the right keystream, and says so."""

    def broken(fn, **kwargs):
        raise RuntimeError("no triton")

    def wrong(fn, **kwargs):
        return lambda key, nonce, counters: fn(key, nonce, counters) ^ 1

    for compiler, message in [(broken, "failed"), (wrong, "disagrees")]:
        monkeypatch.setattr(device_noise.torch, "compile", compiler)
        g = ChaChaGaussian(compiled=True)
        key, nonce = (
            b"".join(w.to_bytes(4, "little") for w in g._key),
            b"".join(w.to_bytes(4, "little") for w in g._nonce),
        )
        with pytest.warns(UserWarning, match=message):
            words = g.keystream_words(2, "cpu")
        assert words.numpy().astype("<u4").tobytes() == _openssl(key, nonce, 0, 128)
        assert g._blocks is chacha20_blocks
