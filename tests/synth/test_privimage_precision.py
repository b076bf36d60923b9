"""bfloat16 autocast: chosen only where it is native, validated, float32 clipping under it, samples that
match float32's, its own pre-training cache key, and recorded in the release's parameters."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from accounting.errors import InvalidParameterError
from synth.mechanisms.privimage import PrivImageConfig
from synth.mechanisms.privimage.model import make_scheduler, make_unet
from synth.mechanisms.privimage.precision import (
    PRECISION_ENV,
    native_bfloat16,
    resolve_precision,
)
from synth.mechanisms.privimage.sampling import sample_images
from synth.mechanisms.privimage.training import (
    HOOKS_LOSS_REDUCTION,
    _per_sample_gradients,
    _pretrain_key,
)

CPU = torch.device("cpu")


def _unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return make_unet(16, 1, 2, (8, 16), 1)


def test_auto_picks_bfloat16_exactly_where_it_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRECISION_ENV, raising=False)
    assert resolve_precision("auto", CPU) == ("bfloat16" if native_bfloat16(CPU) else "float32")
    assert resolve_precision("float32", CPU) == "float32"


def test_auto_is_float32_on_a_gpu_even_with_native_bfloat16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured on an H200: bfloat16 autocast made our DP-SGD and sampling steps slower there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gpu = torch.device("cuda")
    assert native_bfloat16(gpu)
    assert resolve_precision("auto", gpu) == "float32"
    assert resolve_precision("bfloat16", gpu) == "bfloat16"


def test_the_environment_replaces_auto_and_an_explicit_precision_still_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PRIVRELEASE_PRECISION=float32 runs what a CPU without bfloat16 runs (`make demo` timings)."""
    monkeypatch.setenv(PRECISION_ENV, "float32")
    assert resolve_precision("auto", CPU) == "float32"
    if native_bfloat16(CPU):
        assert resolve_precision("bfloat16", CPU) == "bfloat16"
    monkeypatch.setenv(PRECISION_ENV, "fp16")
    with pytest.raises(InvalidParameterError, match="PRIVRELEASE_PRECISION must be one of.*'fp16'"):
        resolve_precision("auto", CPU)
    assert resolve_precision("float32", CPU) == "float32"  # not read when a precision is given


def test_explicit_bfloat16_without_native_support_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not native_bfloat16(CPU)
    assert resolve_precision("auto", CPU) == "float32"
    with pytest.raises(InvalidParameterError, match="no native bfloat16.*'auto'"):
        resolve_precision("bfloat16", CPU)


@pytest.mark.parametrize("bad", ["fp16", "", None, float("nan"), 1e308, 16, True])
def test_config_refuses_unknown_precisions(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="precision must be one of"):
        PrivImageConfig.tiny(1.0, 1e-5, precision=bad)


def test_bfloat16_per_example_gradients_are_clipped_in_float32() -> None:
    """opacus' hooks leave bfloat16 per-example gradients under autocast; the step casts them to float32
    before clipping, and one example's clipped contribution stays within the clipping norm."""
    model = _unet()
    x = torch.randn(1, 1, 16, 16) * 50  # a large gradient, so that clipping is engaged
    y = torch.zeros(1, dtype=torch.long)
    engine = PrivacyEngine(accountant="rdp")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, dp_opt, _ = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=DataLoader(TensorDataset(x, y), batch_size=1),
            noise_multiplier=0.0,
            max_grad_norm=0.5,
            poisson_sampling=False,
            grad_sample_mode="hooks",
            loss_reduction=HOOKS_LOSS_REDUCTION,
        )
        params = [p for p in model.parameters() if p.requires_grad]
        _per_sample_gradients(
            dp_model, dp_opt, make_scheduler(50), params, x, y, 1, CPU, "bfloat16"
        )
    assert {p.grad_sample.dtype for p in params} == {torch.float32}
    raw = math.sqrt(sum(float(p.grad_sample.pow(2).sum()) for p in params))
    dp_opt.pre_step()
    clipped = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params))
    assert raw > 0.5 and clipped <= 0.5 * (1 + 1e-5)
    assert {p.grad.dtype for p in params} == {torch.float32}


def test_bfloat16_samples_stay_close_to_float32_ones() -> None:
    model = _unet().eval()
    labels = np.array([0, 1] * 8)
    kw = dict(
        image_size=16, channels=1, train_timesteps=50, ddim_steps=5, batch=8, seed=0, device=CPU
    )
    full, half = (
        sample_images(model, labels, **kw),
        sample_images(model, labels, precision="bfloat16", **kw),
    )
    assert full.shape == half.shape and full.dtype == half.dtype == np.uint8
    assert (
        np.abs(full.astype(int) - half.astype(int)).mean() < 4.0
    )  # of 255: the same images, rounded


def test_bfloat16_pretraining_has_its_own_cache_key_and_float32_keeps_the_old_one() -> None:
    x, y = -torch.ones(4, 1, 16, 16), torch.arange(4) % 2
    base = dict(
        steps=4, batch=8, lr=1e-3, train_timesteps=50, seed=0, augment=1.0, label_dropout=0.2
    )
    old = _pretrain_key(_unet(), x, y, base)
    assert _pretrain_key(_unet(), x, y, {**base, "precision": "float32"}) == old
    assert _pretrain_key(_unet(), x, y, {**base, "precision": "bfloat16"}) != old


def test_precision_does_not_change_the_plan() -> None:
    """Precision changes what the model computes, not what is charged."""
    from synth.mechanisms.privimage.plan import plan_privimage

    plans = [
        plan_privimage(PrivImageConfig.tiny(2.0, 1e-5, precision=p), 200, n_classes=10)
        for p in ("float32", "bfloat16")
    ]
    assert (
        plans[0].events == plans[1].events
        and plans[0].noise_multiplier == plans[1].noise_multiplier
    )
