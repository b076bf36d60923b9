"""Cost of the secure DP-SGD noise (synth/secure_noise.py) per step against torch's generator, for the
demo's and the default UNet's trainable parameter counts: `python -m benchmarks.secure_noise_bench`."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from opacus.optimizers.optimizer import DPOptimizer

from benchmarks.common import machine, run_dp_finetune, today
from synth import secure_noise
from synth.privimage.model import make_unet
from synth.secure_noise import SecureGaussian, noise_like


def _best_ms(fn, device: torch.device, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def bench(channels: tuple[int, ...], device: torch.device) -> dict:
    params = [p for p in make_unet(28, 1, 10, channels, 1).to(device).parameters()]
    n = sum(p.numel() for p in params)
    gen, secure = torch.Generator(device).manual_seed(0), SecureGaussian()
    plain = _best_ms(lambda: [torch.normal(0, 1.0, p.shape, device=device, generator=gen) for p in params], device)
    safe = _best_ms(lambda: noise_like(secure, params, 1.0), device)
    return {"channels": channels, "params": n, "torch_ms": plain, "secure_ms": safe}


def _timed(fn, spent: list[float]):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        spent.append(time.perf_counter() - t)
        return out
    return wrapper


def in_training(secure: bool, device: torch.device, workdir: Path, steps: int = 4) -> tuple[float, float]:
    """(ms per DP-SGD step, ms of it adding noise) for the demo model, batch 250 of 2,000 images, both timed in
    the same run so the shared machine's load affects them alike."""
    spent: list[float] = []
    workdir.mkdir(parents=True)
    saved = DPOptimizer.add_noise, secure_noise._secure_add_noise
    DPOptimizer.add_noise = _timed(DPOptimizer.add_noise, spent)
    secure_noise._secure_add_noise = _timed(secure_noise._secure_add_noise, spent)
    try:
        t = time.perf_counter()
        run_dp_finetune(2000, widths=(16, 32, 32), layers=1, batch_size=250, max_physical_batch=125, steps=steps,
                        device=device, workdir=workdir, secure_noise=secure)
        total = time.perf_counter() - t
    finally:
        DPOptimizer.add_noise, secure_noise._secure_add_noise = saved
    return total / steps * 1e3, sum(spent) / steps * 1e3


def run(quick: bool = True) -> str:
    """The "Secure noise" section of BENCHMARKS.md (same settings quick or full)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for ch in ((16, 32, 32), (32, 64, 64)):
        r = bench(ch, device)
        rows.append(f"| UNet {ch} | {r['params']:,} | {r['torch_ms']:.1f} | {r['secure_ms']:.1f} |")
    with tempfile.TemporaryDirectory() as tmp:
        steps = {secure: in_training(secure, device, Path(tmp) / str(secure)) for secure in (False, True)}
    lines = [f"| {'secure (default)' if s else 'torch generator'} | {t:.0f} | {n:.1f} | {100 * n / t:.1f}% |"
             for s, (t, n) in steps.items()]
    return "\n".join([
        "## Secure noise", "",
        f"{today()}, {machine()}, {torch.get_num_threads()} torch thread(s), device {device}. "
        "`python -m benchmarks.secure_noise_bench`. DP-SGD noise for every trainable parameter, once per step: torch's "
        "generator (`torch.normal`) vs. synth/secure_noise.py (AES-256-CTR keystream, float64 Box-Muller, sum of 4 "
        "normals). Best of 5.", "",
        "| model | parameters | torch.normal ms | secure ms |", "|---|---|---|---|", *rows, "",
        "Inside DP-SGD (demo UNet, expected batch 250 of 2,000 images, 4 steps; step and noise timed in the same run):",
        "", "| noise | ms per step | of which adding noise, ms | share |", "|---|---|---|---|", *lines])


def main() -> None:
    print(run())


if __name__ == "__main__":
    main()
