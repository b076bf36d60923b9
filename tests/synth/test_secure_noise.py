"""Secure DP-SGD noise: right distribution, unpredictable, never saved, and used by dp_finetune by default."""

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from synth.mechanisms.privimage import PrivImageConfig
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.training import dp_finetune
from synth.tools import dp_noise, secure_noise
from synth.tools.device_noise import ChaChaGaussian
from synth.tools.secure_noise import SecureGaussian

N, SIGMA = 1_000_000, 1.7
# the CPU path (AES keystream from OpenSSL) and the device path (ChaCha20 in torch ops, run here on the CPU)
GENERATORS = pytest.mark.parametrize(
    "make", [SecureGaussian, ChaChaGaussian], ids=["aes", "chacha"]
)


def ks_distance(z: np.ndarray, sigma: float) -> float:
    return float(stats.kstest(z, stats.norm(0, sigma).cdf).statistic)


@GENERATORS
def test_noise_has_the_requested_mean_and_std(make):
    """Tolerances are ~10 standard errors (std of the sample std = sigma/sqrt(2N) = 0.0012): a correct sampler
    cannot fail them by chance, and a sampler off by a few percent in sigma (let alone x2) cannot pass them."""
    z = make().noise((N,), SIGMA).numpy()
    assert z.dtype == np.float64
    assert abs(z.mean()) < 0.02 and abs(z.std() - SIGMA) < 0.012
    assert ks_distance(z, SIGMA) < 0.004  # the 1e-6 critical value at N = 1e6 is ~0.0027
    assert (
        ks_distance(z, 2 * SIGMA) > 0.1 and ks_distance(z, 1.05 * SIGMA) > 0.01
    )  # the same test sees a wrong sigma


@GENERATORS
def test_uniforms_are_in_the_open_interval_with_53_bits(make):
    u = make().uniform(200_000)
    assert u.dtype == torch.float64 and float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005
    frac = (u * 2.0**53 - 0.5).numpy()
    assert np.all(frac == np.round(frac))  # on the 2^-53 grid, offset by half a step


@GENERATORS
def test_two_generators_and_two_draws_differ(make):
    a, b = make(), make()
    first, second = a.noise((1000,), 1.0), a.noise((1000,), 1.0)
    assert not torch.equal(first, second) and not torch.equal(first, b.noise((1000,), 1.0))


@GENERATORS
def test_draws_never_alias_the_reused_workspace(make):
    """The keystream and the Box-Muller scratch space are reused between draws: what a draw returned must not
    change under the next one, and no chunk of a long draw may repeat another."""
    g = make()
    first = g.noise((1000,), 1.0)
    kept = first.clone()
    g.noise((1000,), 1.0), g.standard_normal(999), g.uniform(77)
    assert torch.equal(first, kept)
    n = 2 * secure_noise._CHUNK + 3  # three chunks, the last one short
    z = g.noise((n,), SIGMA)
    c = secure_noise._CHUNK
    assert not torch.equal(z[:c], z[c : 2 * c]) and z.shape == (n,)
    assert abs(float(z.std()) - SIGMA) < 0.02
    odd = g.standard_normal(4 * c + 1)  # odd length, more than one Box-Muller chunk
    assert (
        odd.shape == (4 * c + 1,)
        and not torch.equal(odd[:c], odd[2 * c : 3 * c])
        and abs(float(odd.std()) - 1) < 0.02
    )


@GENERATORS
def test_off_cpu_the_words_are_shipped_and_converted_on_the_device(make):
    """The branch a GPU takes (keystream words copied to the device, converted and transformed there), run on
    torch's meta device: shapes and dtypes only, so a CPU-only machine still executes every line of it (for
    ChaCha20: the keystream and its conversion as ops on the device)."""
    g = make()
    assert (
        g.noise((3, 5), 1.0, "meta").shape == (3, 5)
        and g.noise((3, 5), 1.0, "meta").dtype == torch.float64
    )
    assert g.standard_normal(7, "meta").shape == (7,) and g.uniform(5, "meta").device.type == "meta"


@pytest.mark.parametrize("make", [SecureGaussian, ChaChaGaussian, dp_noise.SecureNoise])
def test_the_generator_cannot_be_saved_or_copied(tmp_path, make):
    g = make()
    with pytest.raises(TypeError, match="secret key"):
        pickle.dumps(g)
    with pytest.raises(TypeError, match="secret key"):
        torch.save({"g": g}, tmp_path / "x.pt")


def _finetune(tmp_path: Path, **kw) -> None:
    torch.manual_seed(0)
    x, y = torch.rand(24, 1, 28, 28) * 2 - 1, torch.arange(24) % 10
    dp_finetune(
        make_unet(28, 1, 10, (8, 16), 1),
        x,
        y,
        sample_rate=0.25,
        noise_multiplier=1.0,
        steps=4,
        batch_size=6,
        max_physical_batch=6,
        max_grad_norm=1.0,
        lr=1e-3,
        ema_decay=0.5,
        train_timesteps=100,
        seed=0,
        device=torch.device("cpu"),
        workdir=tmp_path,
        ckpt_every=2,
        on_resume=lambda s, d: None,
        **kw,
    )


def _spy(monkeypatch) -> tuple[list[bytes], list[int]]:
    """Record the key material handed out by os.urandom and count secure noise draws (both call through)."""
    keys, draws, real_urandom, real_noise = [], [], os.urandom, SecureGaussian.noise

    def urandom(n: int) -> bytes:
        out = real_urandom(n)
        keys.append(out)
        return out

    def noise(self, shape, std, device="cpu"):
        draws.append(int(np.prod(shape)))
        return real_noise(self, shape, std, device)

    monkeypatch.setattr(secure_noise.os, "urandom", urandom)
    monkeypatch.setattr(SecureGaussian, "noise", noise)
    return keys, draws


def test_dp_finetune_uses_secure_noise_by_default_and_never_saves_the_key(tmp_path, monkeypatch):
    keys, draws = _spy(monkeypatch)
    _finetune(tmp_path)
    aes_keys = [k for k in keys if len(k) == 32]
    assert aes_keys and draws  # a fresh key was drawn and every step's noise came from it
    saved = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert saved  # checkpoints were written ...
    for path in saved:  # ... and none holds the key or the initial counter
        blob = path.read_bytes()
        assert not any(k in blob for k in keys if len(k) >= 16), path


def test_secure_noise_can_be_turned_off_and_is_recorded_in_the_config(tmp_path, monkeypatch):
    _, draws = _spy(monkeypatch)
    _finetune(tmp_path, secure_noise=False)
    assert draws == []
    assert PrivImageConfig(epsilon=1.0, delta=1e-5).as_dict()["secure_noise"] is True
    with pytest.raises(Exception, match="secure_noise must be true or false"):
        PrivImageConfig(epsilon=1.0, delta=1e-5, secure_noise="yes")
