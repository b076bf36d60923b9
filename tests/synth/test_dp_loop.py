"""dp_finetune's loop without host round-trips: Poisson batches drawn ahead (synth/mechanisms/privimage/poisson_batches.py) are
opacus' own draws, Binomial(N, q) in size, split as BatchMemoryManager splits them, and the loop's outputs for
fixed seeds are those of opacus' DataLoader path (the charged steps and events included)."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.training_utils import EMAModel
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, TensorDataset

from synth.mechanisms.privimage import training
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.poisson_batches import PoissonBatches, physical_batches

PER_SAMPLE_GRADIENTS = training._per_sample_gradients


def _opacus_batches(
    n: int, batch: int, seed: int, epochs: int
) -> tuple[list[list[int]], float, int]:
    loader = DPDataLoader.from_data_loader(
        DataLoader(
            TensorDataset(torch.arange(n)),
            batch_size=batch,
            generator=torch.Generator().manual_seed(seed),
        )
    )
    return [xb.tolist() for _ in range(epochs) for (xb,) in loader], loader.sample_rate, len(loader)


@pytest.mark.parametrize("ahead", [1, 3, 64])
def test_the_batches_drawn_ahead_are_opacus_poisson_batches(ahead: int) -> None:
    """Same generator state -> the same index sets step by step, across epochs, however far ahead they are drawn."""
    expected, q, per_epoch = _opacus_batches(90, 10, seed=11, epochs=3)
    sampler = PoissonBatches(
        90,
        q,
        torch.Generator().manual_seed(11),
        torch.device("cpu"),
        steps_per_epoch=per_epoch,
        ahead=ahead,
    )
    got = [sampler.next().tolist() for _ in expected]
    assert got == expected
    assert (
        any(len(b) == 0 for b in got) or len({len(b) for b in got}) > 3
    )  # sizes vary: really Poisson


def test_batch_sizes_are_binomial_with_the_charged_rate() -> None:
    """N = 2,000, q = 0.03, 3,000 steps: mean N q = 60 (standard error 0.14), variance N q (1 - q) = 58.2 (relative
    standard error ~2.6%), each example in ~q of the steps. Tolerances ~6 standard errors: a correct sampler
    cannot fail them, a rate off by 5% (or a fixed batch size, variance 0) cannot pass them."""
    n, q, steps = 2000, 0.03, 3000
    sampler = PoissonBatches(
        n,
        q,
        torch.Generator().manual_seed(secrets.randbits(63)),
        torch.device("cpu"),
        steps_per_epoch=34,
        ahead=64,
    )
    batches = [sampler.next() for _ in range(steps)]
    sizes = np.array([len(b) for b in batches], dtype=float)
    assert abs(sizes.mean() - n * q) < 0.85
    assert abs(sizes.var() / (n * q * (1 - q)) - 1) < 0.16
    counts = np.bincount(torch.cat(batches).numpy(), minlength=n)
    assert abs(counts.mean() / steps - q) < 0.0006 and counts.std() / steps < 2 * np.sqrt(
        q * (1 - q) / steps
    )
    assert all(bool((b[1:] > b[:-1]).all()) for b in batches)  # no index twice in a step


def test_physical_batches_split_as_batch_memory_manager() -> None:
    for size, cap in [(0, 4), (3, 4), (4, 4), (9, 4), (10, 3), (250, 125), (251, 125)]:
        idx = torch.arange(size)
        expected = [p.tolist() for p in np.array_split(np.arange(size), max(1, -(-size // cap)))]
        assert [p.tolist() for p in physical_batches(idx, cap)] == expected


def test_foreach_ema_is_the_per_tensor_ema() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    a, b = EMAModel(params, decay=0.9), EMAModel(params, decay=0.9, foreach=True)
    for _ in range(5):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn_like(p))
        a.step(params), b.step(params)
    for s, t in zip(a.shadow_params, b.shadow_params):
        torch.testing.assert_close(s, t, rtol=1e-6, atol=1e-7)


def _run(tmp_path: Path, monkeypatch, old_loop: bool) -> tuple[training.DpSgdOutcome, list[int]]:
    """dp_finetune with every random source fixed (the sampling and noise generators are seeded from `secrets`),
    physical batches of at most 3 so that steps split; the per-step physical batch sizes are recorded."""
    tmp_path.mkdir()
    monkeypatch.setattr(training.secrets, "randbits", lambda bits: 1234)
    if old_loop:  # opacus' DataLoader through BatchMemoryManager, as the loop did before (and does under torchrun)
        monkeypatch.setattr(training, "_presampled_steps", training._loader_steps)
    sizes: list[int] = []
    real = PER_SAMPLE_GRADIENTS

    def spy(dp_model, dp_opt, sched, params, xb, yb, *args, **kwargs):
        sizes.append(len(xb))
        return real(dp_model, dp_opt, sched, params, xb, yb, *args, **kwargs)

    monkeypatch.setattr(training, "_per_sample_gradients", spy)
    torch.manual_seed(0)
    x, y = torch.rand(40, 1, 28, 28) * 2 - 1, torch.arange(40) % 10
    torch.manual_seed(1)
    out = training.dp_finetune(
        make_unet(28, 1, 10, (8, 16), 1),
        x,
        y,
        sample_rate=0.125,
        noise_multiplier=1.0,
        steps=9,
        batch_size=5,
        max_physical_batch=3,
        max_grad_norm=1.0,
        lr=1e-3,
        ema_decay=0.5,
        train_timesteps=100,
        seed=0,
        device=torch.device("cpu"),
        workdir=tmp_path,
        ckpt_every=4,
        on_resume=lambda s, d: None,
        secure_noise=False,
    )
    return out, sizes


def test_the_loop_computes_what_opacus_loader_loop_computed(tmp_path, monkeypatch) -> None:
    """Same seeds: the same batches (8 steps an epoch, so the run crosses an epoch), the same physical splits, the
    same weights bit for bit, the same charged steps and accountant history."""
    new, new_sizes = _run(tmp_path / "new", monkeypatch, old_loop=False)
    old, old_sizes = _run(tmp_path / "old", monkeypatch, old_loop=True)
    assert new_sizes == old_sizes and max(new_sizes) <= 3 and len(new_sizes) > 9
    assert new.steps == old.steps == 9
    assert new.opacus_history == old.opacus_history == [(1.0, 0.125, 9)]
    assert new.opacus_sample_rate == old.opacus_sample_rate == 0.125
    assert new.weights.keys() == old.weights.keys()
    for k in new.weights:
        assert torch.equal(new.weights[k], old.weights[k]), k
