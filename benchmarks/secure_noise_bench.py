"""Cost of the secure DP-SGD noise (synth/secure_noise.py) per step against torch's generator, for the
demo's and the default UNet's trainable parameter counts: `python -m benchmarks.secure_noise_bench`."""
from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

import torch
from opacus.optimizers.optimizer import DPOptimizer

from synth import secure_noise
from synth.privimage.model import make_unet
from synth.privimage.training import dp_finetune
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
        x, y = torch.rand(2000, 1, 28, 28) * 2 - 1, torch.arange(2000) % 10
        torch.manual_seed(0)
        t = time.perf_counter()
        dp_finetune(make_unet(28, 1, 10, (16, 32, 32), 1), x, y, sample_rate=0.125, noise_multiplier=1.0, steps=steps,
                    batch_size=250, max_physical_batch=125, max_grad_norm=1.0, lr=3e-4, ema_decay=0.999,
                    train_timesteps=1000, seed=0, device=device, workdir=workdir, ckpt_every=100,
                    on_resume=lambda s, d: None, secure_noise=secure)
        total = time.perf_counter() - t
    finally:
        DPOptimizer.add_noise, secure_noise._secure_add_noise = saved
    return total / steps * 1e3, sum(spent) / steps * 1e3


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"device: {device} ({name}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    for ch in ((16, 32, 32), (32, 64, 64)):
        r = bench(ch, device)
        print(f"UNet {ch}: {r['params']:,} params  torch.normal {r['torch_ms']:.1f} ms  "
              f"secure {r['secure_ms']:.1f} ms per step ({r['secure_ms'] / r['torch_ms']:.0f}x)")
    with tempfile.TemporaryDirectory() as tmp:
        for secure in (False, True):
            step, noise = in_training(secure, device, Path(tmp) / str(secure))
            print(f"demo DP-SGD step (UNet (16, 32, 32), batch 250), {'secure' if secure else 'torch'} noise: "
                  f"{step:.0f} ms per step, of which adding noise {noise:.1f} ms ({100 * noise / step:.1f}%)")


if __name__ == "__main__":
    main()
