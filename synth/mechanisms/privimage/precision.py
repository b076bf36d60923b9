"""Compute precision of the UNet: float32, or bfloat16 autocast where the hardware runs it natively.

bfloat16 autocast runs the convolutions in bfloat16 and keeps weights, optimiser state, losses, the
DDIM update and DP-SGD's clipping and noise in float32. On a CPU with AVX512-BF16 (or AMX) it halves
the cost of a sampling step; without native support it is emulated and slower, so "auto" only picks
it there. On a GPU "auto" is float32: on an H200 bfloat16 did not pay for our small UNets (32/64/64
UNet, batch 500: plain step equal, DP-SGD step 25% and sampling step 18% slower in bfloat16;
BENCHMARKS-NOTEBOOK.md, "DP-SGD step cost on one GPU"); an explicit "bfloat16" still runs there.
Precision changes what the model computes, never what is charged: DP-SGD clips and noises
whatever per-example gradient it is given, so the guarantee is the same in either precision.

PRIVRELEASE_PRECISION ("float32" or "bfloat16") replaces "auto" for a whole process: "float32" runs
what a CPU without bfloat16 runs (`make demo` timings on such a CPU, measured on one that has it).
An explicit precision in a spec or on the command line still wins."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager

import torch

from accounting.errors import InvalidParameterError

PRECISIONS = ("auto", "float32", "bfloat16")
PRECISION_ENV = "PRIVRELEASE_PRECISION"


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` runs bfloat16 convolutions natively (CUDA with bf16, a CPU with AVX512-BF16
    or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        cpu = torch.cpu
        return bool(
            getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
            or getattr(cpu, "_is_amx_tile_supported", lambda: False)()
        )
    return False


def resolve_precision(requested: str, device: torch.device) -> str:
    """The precision to train in on `device`, "float32" or "bfloat16".

    "auto" picks bfloat16 on a CPU where it is native, float32 on a GPU (the faster there,
    BENCHMARKS.md);
    an explicit "bfloat16" on hardware that would only emulate it is refused (it would run several
    times slower)."""
    if requested not in PRECISIONS:
        raise InvalidParameterError(f"precision must be one of {PRECISIONS}, got {requested!r}.")
    if requested == "auto":
        requested = _environment_precision()
    if requested == "auto":
        return "bfloat16" if device.type == "cpu" and native_bfloat16(device) else "float32"
    if requested == "bfloat16" and not native_bfloat16(device):
        raise InvalidParameterError(
            f"precision 'bfloat16' was asked for, but this {device.type} has no native bfloat16 "
            "support (AVX512-BF16 or AMX on a CPU, a bf16-capable GPU); it would be emulated and "
            "slower. Use precision 'auto' (picks float32 here) or 'float32'."
        )
    return requested


def _environment_precision() -> str:
    """PRIVRELEASE_PRECISION when set ("float32" or "bfloat16"), else "auto"."""
    value = os.environ.get(PRECISION_ENV, "").strip()
    if not value:
        return "auto"
    if value not in PRECISIONS:
        raise InvalidParameterError(
            f"{PRECISION_ENV} must be one of {PRECISIONS}, got {value!r}; unset it to let "
            "'auto' choose."
        )
    return value


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    """The autocast context of a resolved precision (a no-op context for float32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16")
