"""DP-SGD step cost vs a plain step, by per-sample-gradient method (issue: DP-SGD throughput).

    python -m benchmarks.dpsgd_throughput [--batch 100] [--rounds 3]

Same UNet, same batch, same Adam, one process; the methods are interleaved round by round and each
figure is the median of the rounds, so machine noise hits every method alike. DP steps include
opacus' per-sample clipping and noise. Methods that fail are reported with their error.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable

import torch

from benchmarks.common import machine, md_table, today
from synth.privimage.model import ddpm_loss, make_scheduler, make_unet

WIDTHS = (16, 32, 32)
METHODS = {
    "plain (no DP)": dict(dp=False),
    "plain, channels-last": dict(dp=False, channels_last=True),
    "opacus hooks": dict(dp=True, mode="hooks"),
    "opacus functorch (product default)": dict(dp=True, mode="functorch"),
    "opacus expanded weights": dict(dp=True, mode="ew"),
}


def _step_fn(method: dict, batch: int) -> Callable[[], None]:
    from opacus.grad_sample import get_gsm_class
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(0)
    model = make_unet(28, 1, 10, WIDTHS, 2)
    fmt = torch.channels_last if method.get("channels_last") else torch.contiguous_format
    model = model.to(memory_format=fmt)
    x = torch.randn(batch, 1, 28, 28).to(memory_format=fmt)
    y = torch.randint(0, 10, (batch,))
    sched = make_scheduler(1000)
    if method["dp"]:
        mode = method["mode"]
        gsm_cls = get_gsm_class("hooks" if mode == "functorch" else mode)
        kwargs = {"force_functorch": True} if mode == "functorch" else {}
        model = gsm_cls(model, batch_first=True, loss_reduction="mean", **kwargs)
        opt = DPOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=batch)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad()
        ddpm_loss(model, sched, x, y).backward()
        opt.step()
    return step


def _time(step: Callable[[], None], reps: int) -> float:
    step()  # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t) / reps


def measure(batch: int = 100, rounds: int = 3, reps: int = 3) -> dict[str, float | str]:
    """Seconds per step for every method (or the error text of a method that cannot run)."""
    times: dict[str, list[float]] = {name: [] for name in METHODS}
    errors: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(rounds):
            for name, method in METHODS.items():
                if name in errors:
                    continue
                try:
                    times[name].append(_time(_step_fn(method, batch), reps))
                except Exception as exc:  # a method opacus cannot apply to this model: report it, go on
                    errors[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
    return {name: errors.get(name) or statistics.median(times[name]) for name in METHODS}


def render(result: dict[str, float | str], batch: int, seconds: float) -> str:
    base = result["plain (no DP)"]
    rows = [[name, f"{v * 1000:.0f}" if isinstance(v, float) else "-",
             f"{v / base:.2f}x" if isinstance(v, float) else f"fails ({v})"] for name, v in result.items()]
    return (f"## DP-SGD step cost by per-sample-gradient method (`python -m benchmarks.dpsgd_throughput`)\n\n"
            f"UNet {list(WIDTHS)}, batch {batch}, Adam, CPU; methods interleaved, median of rounds. {today()}, "
            f"{machine()}, {seconds:.0f} s.\n\n" + md_table(["method", "ms per step", "vs plain step"], rows))


def run(quick: bool = True) -> str:
    t = time.time()
    result = measure(rounds=2 if quick else 3)
    return render(result, 100, time.time() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    t = time.time()
    print(render(measure(args.batch, args.rounds), args.batch, time.time() - t))


if __name__ == "__main__":
    main()
