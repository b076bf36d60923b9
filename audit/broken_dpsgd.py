"""Deliberately broken DP-SGD trainers: the controls of the one-run audit (the audit must flag
each).

Each wraps PrivImage's real DP-SGD trainer (`synth.registry.dpsgd_trainer("privimage")`, its
`dp_finetune`) with one privacy bug while the ledger would still charge the planned (sigma, q,
steps): the tests and `benchmarks/audit_bench.py` run the audit against them."""

from __future__ import annotations

import math
from typing import Any

from synth import registry


def _dp_finetune(model: Any, x: Any, y: Any, **kw: Any) -> Any:
    return registry.dpsgd_trainer("privimage")(model, x, y, **kw)


def no_noise(model: Any, x: Any, y: Any, **kw: Any) -> Any:
    """Broken: the noise multiplier is dropped (0) while the ledger charges the calibrated one."""
    return _dp_finetune(model, x, y, **{**kw, "noise_multiplier": 0.0})


def no_clipping(model: Any, x: Any, y: Any, **kw: Any) -> Any:
    """Broken: per-sample gradients are not clipped (clip norm 1e6) while the noise std stays sigma
    * C."""
    big = 1e6 * kw["max_grad_norm"]
    return _dp_finetune(
        model,
        x,
        y,
        **{
            **kw,
            "max_grad_norm": big,
            "noise_multiplier": kw["noise_multiplier"] * kw["max_grad_norm"] / big,
        },
    )


def double_rate(model: Any, x: Any, y: Any, **kw: Any) -> Any:
    """Broken: samples with twice the charged rate (batch doubled) while the ledger charges q."""
    b = 2 * kw["batch_size"]
    return _dp_finetune(
        model, x, y, **{**kw, "batch_size": b, "sample_rate": 1 / math.ceil(len(x) / b)}
    )
