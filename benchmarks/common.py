"""Shared benchmark helpers: machine description and timing."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    cpu = platform.processor() or platform.machine()
    return (
        f"{platform.node()} — {cpu}, {os.cpu_count()} cores, {gpu}; Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


@contextmanager
def timer() -> Iterator[list[float]]:
    """`with timer() as t: ...` then t[0] holds the elapsed seconds."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)


def md_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def throwaway_store(root, name: str, data, epsilon: float, delta: float):
    """A fresh workspace whose ledger holds one dataset, for one charged benchmark run planned to
    `epsilon`.

    The run's plan calibrates its noise so that the RDP epsilon of its fixed sequence of mechanisms is
    `epsilon` (what the tables report, as the papers do). The ledger's cap is a privacy filter for adaptively
    chosen releases, whose stricter stop rule (accounting.filter) would refuse that plan at cap = epsilon
    (by 10-30%), so the throw-away ledger gets cap 2 x epsilon: it only has to admit the one run."""
    from accounting import ledger
    from accounting.store import Store, Workspace

    ws = Workspace(root)
    ws.init()
    store = Store(ws)
    ledger.register_dataset(
        store,
        name=name,
        source="builtin:mnist5k",
        fingerprint=f"benchmark-{name}",
        record_count=len(data),
        labels=data.label_set,
        image_shape=list(data.image_shape),
        epsilon_cap=2 * epsilon,
        delta_cap=delta,
    )
    return store


def run_dp_finetune(
    n_images: int,
    *,
    widths: tuple[int, ...],
    layers: int,
    batch_size: int,
    max_physical_batch: int,
    steps: int,
    device,
    workdir,
    **options,
) -> None:
    """The product's DP-SGD loop (synth.mechanisms.privimage.training.dp_finetune) on `n_images`
    random 28x28 images with
    the demo's fixed settings (clip 1, noise 1, EMA 0.999, 1,000 diffusion steps), for benchmarks that time its
    steps from outside; `options` go to dp_finetune (progress, secure_noise, precision, ...)."""
    import torch

    from synth.mechanisms.privimage.model import make_unet
    from synth.mechanisms.privimage.training import dp_finetune

    torch.manual_seed(0)
    x, y = torch.rand(n_images, 1, 28, 28) * 2 - 1, torch.arange(n_images) % 10
    dp_finetune(
        make_unet(28, 1, 10, widths, layers),
        x,
        y,
        sample_rate=batch_size / n_images,
        noise_multiplier=1.0,
        steps=steps,
        batch_size=batch_size,
        max_physical_batch=max_physical_batch,
        max_grad_norm=1.0,
        lr=3e-4,
        ema_decay=0.999,
        train_timesteps=1000,
        seed=0,
        device=device,
        workdir=workdir,
        ckpt_every=10**9,
        on_resume=lambda s, d: None,
        **options,
    )
