"""DP-SGD step cost vs a plain step, by per-sample-gradient method and compute precision (issue:
DP-SGD
throughput), and the cost of a sampling step in each precision.

    python -m benchmarks.dpsgd_throughput [--batch 100] [--rounds 3] [--device cuda --widths 32,64,64]

Same UNet (the demo's: 16/32/32, one layer per block), same batch, same Adam, one process; the methods are
interleaved round by round and each figure is the median of the rounds, so machine noise hits every
method
alike. DP steps include opacus' per-sample clipping (in float32) and noise; "grouped-conv" rows compute
Conv2d and GroupNorm per-example gradients by synth.mechanisms.privimage.conv_grad_sample, the others by opacus; "no summed conv
gradients" rows also skip autograd's summed Conv2d weight/bias gradients, which the DP optimiser discards
(conv_grad_sample.per_example_gradients_only, as dp_finetune does) and divide the noisy sum as dp_finetune's
optimiser does (training.scale_grad_once). bfloat16 rows run under autocast
and are measured only where the hardware has native bfloat16 (synth.mechanisms.privimage.precision). Methods that
fail are reported with their error. "Whole DP-SGD loop" rows time a step of dp_finetune itself (the
interval between its progress calls): a Poisson batch of the expected size from 16 x batch images in
one
physical pass, secure noise, EMA and the write-ahead log included, the precision as the row says.
Off the
CPU the product uses opacus' own samplers (the grouped backward is CPU-only, conv_grad_sample.GROUPED_DEVICES);
rows marked "forced on this device" run it there for comparison. "Before issue 34" is the loop through opacus'
DataLoader and BatchMemoryManager with the per-tensor EMA (what torchrun still runs); off the CPU, the loop with
the host's AES noise and with torch's generator show what the noise on the device saves. `--only`, `--json`,
`--all-rows` and `--profile` serve benchmarks/gpu_speed.sh.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from diffusers.training_utils import EMAModel

from benchmarks.common import machine, md_table, run_dp_finetune, today
from synth.mechanisms.privimage import conv_grad_sample, training
from synth.mechanisms.privimage.conv_grad_sample import install as install_grouped_conv
from synth.mechanisms.privimage.conv_grad_sample import per_example_gradients_only
from synth.mechanisms.privimage.conv_grad_sample import uninstall as uninstall_grouped_conv
from synth.mechanisms.privimage.model import ddpm_loss, make_scheduler, make_unet
from synth.mechanisms.privimage.precision import autocast, native_bfloat16
from synth.mechanisms.privimage.training import (
    HOOKS_LOSS_REDUCTION,
    _per_sample_gradients,
    scale_grad_once,
)
from synth.tools import dp_noise

WIDTHS, LAYERS = (16, 32, 32), 1
BF16 = dict(precision="bfloat16")
GROUPED = dict(mode="hooks", grouped_conv=True)
PRODUCT = dict(**GROUPED, per_example_only=True)  # dp_finetune: also no summed conv gradients
METHODS = {
    "plain (no DP)": dict(dp=False),
    "plain, channels-last": dict(dp=False, channels_last=True),
    "opacus hooks, grouped-conv, no summed conv gradients (product in float32)": dict(
        dp=True, **PRODUCT
    ),
    "opacus hooks, grouped-conv, summed conv gradients computed too": dict(dp=True, **GROUPED),
    "opacus hooks, opacus' own samplers": dict(dp=True, mode="hooks"),
    "opacus functorch": dict(dp=True, mode="functorch"),
    "opacus expanded weights": dict(dp=True, mode="ew"),
    "plain, bfloat16 autocast": dict(dp=False, **BF16),
    "opacus hooks, grouped-conv, no summed conv gradients, bfloat16 autocast (product on a CPU "
    "with native bfloat16)": dict(dp=True, **PRODUCT, **BF16),
    "opacus hooks, grouped-conv, summed conv gradients too, bfloat16 autocast": dict(
        dp=True, **GROUPED, **BF16
    ),
    "opacus hooks, opacus' own samplers, bfloat16 autocast": dict(dp=True, mode="hooks", **BF16),
    "opacus functorch, bfloat16 autocast": dict(dp=True, mode="functorch", **BF16),
    "opacus hooks, grouped-conv, no summed conv gradients, channels-last": dict(
        dp=True, **PRODUCT, channels_last=True
    ),
    "the product's whole DP-SGD loop (dp_finetune), float32": dict(loop=True),
    "the whole loop as before issue 34 (opacus DataLoader + BatchMemoryManager, per-tensor EMA), float32": dict(
        loop=True, previous_loop=True
    ),
    "the product's whole DP-SGD loop (dp_finetune), bfloat16 autocast": dict(loop=True, **BF16),
    "sampling step (UNet forward, no grad)": dict(sampling=True),
    "sampling step, bfloat16 autocast": dict(sampling=True, **BF16),
}
# off the CPU: the grouped backward where the product does not use it, side by side with the product
FORCED = {
    "opacus hooks, grouped-conv forced on this device, no summed conv gradients": dict(
        dp=True, **PRODUCT, force=True
    ),
    "opacus hooks, grouped-conv forced on this device, no summed conv gradients, bfloat16 autocast": dict(
        dp=True, **PRODUCT, **BF16, force=True
    ),
}
# off the CPU: where the loop's secure noise comes from (the CPU's product path is the AES one
# already)
NOISE_ROWS = {
    "the whole loop, secure noise from the host's AES keystream (before issue 34), float32": dict(
        loop=True, noise="aes"
    ),
    "the whole loop, torch's generator for the noise (not secure; reference), float32": dict(
        loop=True, noise="torch"
    ),
}
FORCED.update(NOISE_ROWS)
ALL_METHODS = {**METHODS, **FORCED}


def _step_fn(
    method: dict, batch: int, device: torch.device, widths: tuple[int, ...]
) -> Callable[[], None]:
    from opacus.grad_sample import get_gsm_class
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(0)
    model = make_unet(28, 1, 10, widths, LAYERS)
    fmt = torch.channels_last if method.get("channels_last") else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    x = torch.randn(batch, 1, 28, 28).to(device, memory_format=fmt)
    y = torch.randint(0, 10, (batch,), device=device)
    sched = make_scheduler(1000)
    precision = method.get("precision", "float32")
    if method.get("sampling"):
        model.eval()
        t = torch.full((batch,), 500, device=device)

        @torch.no_grad()
        def forward() -> None:
            with autocast(device, precision):
                model(x, t, class_labels=y).sample.float()

        return forward
    if method["dp"]:
        mode = method["mode"]
        gsm_cls = get_gsm_class("hooks" if mode == "functorch" else mode)
        kwargs = {"force_functorch": True} if mode == "functorch" else {}
        model = gsm_cls(model, batch_first=True, loss_reduction=HOOKS_LOSS_REDUCTION, **kwargs)
        opt = DPOptimizer(
            torch.optim.Adam(model.parameters(), lr=1e-4),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            expected_batch_size=batch,
        )
        if method.get(
            "per_example_only"
        ):  # the product's rows: its optimiser as dp_finetune sets it up
            scale_grad_once(opt)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    params = list(model.parameters())

    def step() -> None:
        if method[
            "dp"
        ]:  # the product's DP forward/backward: autocast, then float32 per-example gradients
            (install_grouped_conv if method.get("grouped_conv") else uninstall_grouped_conv)()
            added = (
                {device.type} - conv_grad_sample.GROUPED_DEVICES if method.get("force") else set()
            )
            conv_grad_sample.GROUPED_DEVICES |= added
            try:
                with (
                    per_example_gradients_only(model)
                    if method.get("per_example_only")
                    else nullcontext()
                ):
                    _per_sample_gradients(model, opt, sched, params, x, y, 1, device, precision)
            finally:
                conv_grad_sample.GROUPED_DEVICES -= added
        else:
            opt.zero_grad()
            with autocast(device, precision):
                loss = ddpm_loss(model, sched, x, y)
            loss.backward()
        opt.step()

    return step


@contextmanager
def loop_variant(method: dict) -> Iterator[None]:
    """dp_finetune as `method` says: the loop before issue 34 (opacus' DataLoader through
    BatchMemoryManager, the
    per-tensor EMA: what it still does under torchrun), or the secure noise from one path for every device."""
    saved = training._presampled_steps, training.EMAModel, training.install_secure_noise
    if method.get("previous_loop"):
        training._presampled_steps = training._loader_steps
        training.EMAModel = functools.partial(EMAModel, foreach=False)
    if method.get("noise") in ("aes", "chacha"):
        training.install_secure_noise = functools.partial(dp_noise.install, path=method["noise"])
    try:
        yield
    finally:
        training._presampled_steps, training.EMAModel, training.install_secure_noise = saved


def _loop_time(
    method: dict, batch: int, device: torch.device, widths: tuple[int, ...], reps: int
) -> float:
    """Median seconds between consecutive steps of dp_finetune (the product's loop), `reps` intervals."""
    stamps: list[float] = []

    def progress(_stage: str, _done: int, _total: int) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as workdir, loop_variant(method):
        run_dp_finetune(
            16 * batch,
            widths=widths,
            layers=LAYERS,
            batch_size=batch,
            max_physical_batch=2 * batch,
            steps=reps + 1,
            device=device,
            workdir=Path(workdir),
            progress=progress,
            precision=method.get("precision", "float32"),
            secure_noise=method.get("noise") != "torch",
        )
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def _time(step: Callable[[], None], reps: int, device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()  # warm-up
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        step()
    sync()
    return (time.perf_counter() - t) / reps


def methods(device: torch.device, only: str = "", all_rows: bool = False) -> dict[str, dict]:
    """The rows to measure: the CPU's, or all off the CPU (or with `all_rows`); with `only`, the
    rows whose name
    contains one of its ";"-separated parts (row names have commas), plus the plain float32 step ratios need."""
    table = METHODS if device.type == "cpu" and not all_rows else ALL_METHODS
    if only:
        parts = [p.strip() for p in only.split(";") if p.strip()]
        table = {
            k: v for k, v in table.items() if k == "plain (no DP)" or any(p in k for p in parts)
        }
    return table


def measure(
    batch: int = 100,
    rounds: int = 3,
    reps: int = 3,
    device: torch.device = torch.device("cpu"),
    widths: tuple[int, ...] = WIDTHS,
    table: dict[str, dict] | None = None,
) -> dict[str, float | str]:
    """Seconds per step for every method (or the error text of a method that cannot run)."""
    table = methods(device) if table is None else table
    times: dict[str, list[float]] = {name: [] for name in table}
    errors: dict[str, str] = {}
    if not native_bfloat16(device):
        errors.update(
            {
                name: f"no native bfloat16 on this {device.type}"
                for name, m in table.items()
                if m.get("precision") == "bfloat16"
            }
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(rounds):
            for name, method in table.items():
                if name in errors:
                    continue
                try:
                    times[name].append(
                        _loop_time(method, batch, device, widths, reps)
                        if method.get("loop")
                        else _time(_step_fn(method, batch, device, widths), reps, device)
                    )
                except (
                    Exception
                ) as exc:  # a method opacus cannot apply to this model: report it, go on
                    errors[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
    return {name: errors.get(name) or statistics.median(times[name]) for name in table}


def _baseline(name: str, result: dict[str, float | str]) -> float | str:
    """The plain step of the same precision (a sampling step is compared with the float32 sampling step)."""
    method = ALL_METHODS[name]
    if method.get("sampling"):
        return result.get("sampling step (UNet forward, no grad)", "-")
    return result.get(
        "plain, bfloat16 autocast" if method.get("precision") == "bfloat16" else "plain (no DP)",
        "-",
    )


def render(
    result: dict[str, float | str],
    batch: int,
    seconds: float,
    device: torch.device = torch.device("cpu"),
    widths: tuple[int, ...] = WIDTHS,
) -> str:
    fp32 = result["plain (no DP)"]
    rows = []
    for name, v in result.items():
        same = _baseline(name, result)
        if not isinstance(v, float):
            rows.append([name, "-", f"fails ({v})", "-"])
            continue
        ms = f"{v * 1000:.1f}" if v < 0.1 else f"{v * 1000:.0f}"
        rows.append(
            [
                name,
                ms,
                f"{v / fp32:.2f}x" if not ALL_METHODS[name].get("sampling") else "-",
                f"{v / same:.2f}x" if isinstance(same, float) else "-",
            ]
        )
    title = (
        "DP-SGD step cost by per-sample-gradient method (`python -m benchmarks.dpsgd_throughput`)"
        if device.type == "cpu"
        else "DP-SGD step cost on one GPU (`python -m benchmarks.dpsgd_throughput --device cuda`)"
    )
    return (
        f"## {title}\n\n"
        f"UNet {list(widths)} ({LAYERS} layer per block), batch {batch}, Adam, {_device_name(device)}; methods "
        f"interleaved, median of rounds. {today()}, {machine()}, {seconds:.0f} s.\n\n"
        + md_table(
            [
                "method",
                "ms per step",
                "vs plain float32 step",
                "vs same-precision plain step (sampling: vs float32 sampling)",
            ],
            rows,
        )
    )


def rows_json(
    result: dict[str, float | str], batch: int, device: torch.device, widths: tuple[int, ...]
) -> list[dict]:
    """One JSON object per row (ms per step, or the error), for the GPU script's $OUT."""
    plain = result["plain (no DP)"]
    return [
        {
            "row": name,
            "device": _device_name(device),
            "widths": list(widths),
            "batch": batch,
            "ms_per_step": round(v * 1000, 3) if isinstance(v, float) else None,
            "vs_plain": round(v / plain, 3)
            if isinstance(v, float) and isinstance(plain, float)
            else None,
            "error": None if isinstance(v, float) else v,
            "when": today(),
        }
        for name, v in result.items()
    ]


PROFILED = {  # label -> (object, attribute): the parts of a DP-SGD step timed by torch.profiler.record_function
    "Poisson batch indices (drawn ahead)": (
        "synth.mechanisms.privimage.poisson_batches",
        "PoissonBatches.next",
    ),
    "write-ahead log": ("synth.mechanisms.privimage.training", "_write_ahead"),
    "forward + backward + per-sample gradients (opacus hooks)": (
        "synth.mechanisms.privimage.training",
        "_per_sample_gradients",
    ),
    "per-sample norms and clipping (opacus)": (
        "opacus.optimizers.optimizer",
        "DPOptimizer.clip_and_accumulate",
    ),
    "secure noise (draw + add)": ("synth.tools.dp_noise", "_secure_add_noise"),
    "divide by the expected batch": ("synth.mechanisms.privimage.training", "_scale_grad"),
    "Adam": ("torch.optim", "Adam.step"),
    "EMA": ("diffusers.training_utils", "EMAModel.step"),
}


@contextmanager
def _labelled() -> Iterator[None]:
    import importlib

    saved = []
    for label, (module, attr) in PROFILED.items():
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = getattr(owner, name)

        def wrapper(*args, _real=real, _label=label, **kwargs):
            with torch.profiler.record_function(_label):
                return _real(*args, **kwargs)

        saved.append((owner, name, real))
        setattr(owner, name, wrapper)
    try:
        yield
    finally:
        for owner, name, real in reversed(saved):
            setattr(owner, name, real)


def _by_label(events) -> dict[str, list]:
    """The profiler's averaged events grouped by name: on a GPU one record_function range appears
    twice (its CPU range and a device-side annotation with no CPU time), so a plain dict of key ->
    event kept whichever came last and read every labelled part as 0 ms."""
    out: dict[str, list] = {}
    for e in events:
        out.setdefault(e.key, []).append(e)
    return out


def profile_loop(
    batch: int, device: torch.device, widths: tuple[int, ...], step: int | None = None
) -> dict:
    """torch.profiler over one step of dp_finetune (the `step`-th; the ones before warm up): wall ms
    of the step
    and of each labelled part (PROFILED), the rest as "other", and the top operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    # a GPU's first steps load modules and pick kernels (the H100's third step spent 100 ms in
    # cudaFuncGetAttributes and module loading): profile a later one there
    step = step or (8 if device.type == "cuda" else 3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof, marks = profile(activities=activities), {}

    def progress(_stage: str, done: int, _total: int) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if done == step - 1:
            prof.__enter__()
            marks["start"] = time.perf_counter()
        elif done == step:
            marks["end"] = time.perf_counter()
            prof.__exit__(None, None, None)

    with tempfile.TemporaryDirectory() as workdir, _labelled(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_dp_finetune(
            16 * batch,
            widths=widths,
            layers=LAYERS,
            batch_size=batch,
            max_physical_batch=2 * batch,
            steps=step,
            device=device,
            workdir=Path(workdir),
            progress=progress,
        )
    events = _by_label(prof.key_averages())
    total = (marks["end"] - marks["start"]) * 1000
    parts = {
        label: max(e.cpu_time_total for e in events[label]) / 1000
        for label in PROFILED
        if label in events
    }
    gpu_key = "device_time_total" if device.type == "cuda" else None
    device_parts = {
        label: max(getattr(e, gpu_key, 0) for e in events[label]) / 1000
        for label in PROFILED
        if gpu_key and label in events
    }
    top = sorted(
        (e for e in prof.key_averages() if e.key not in PROFILED),
        key=lambda e: -e.self_cpu_time_total,
    )[:15]
    return {
        "device": _device_name(device),
        "widths": list(widths),
        "batch": batch,
        "step_ms": round(total, 2),
        "step": step,
        "parts_ms": {k: round(v, 2) for k, v in parts.items()},
        "parts_device_ms": {k: round(v, 2) for k, v in device_parts.items()},
        "other_ms": round(total - sum(parts.values()), 2),
        "top_ops_self_cpu_ms": {e.key: round(e.self_cpu_time_total / 1000, 2) for e in top},
        "top_ops_device_ms": (
            {
                e.key: round(getattr(e, gpu_key) / 1000, 2)
                for e in sorted(prof.key_averages(), key=lambda e: -getattr(e, gpu_key))[:15]
            }
            if gpu_key
            else {}
        ),
        "when": today(),
        "machine": machine(),
    }


def render_profile(p: dict) -> str:
    """The parts' host (CPU) milliseconds and, on a GPU, their kernels' device milliseconds."""
    dev = p.get("parts_device_ms") or {}

    def row(name: str, ms: float, dev_ms: float | None) -> list[str]:
        cells = [name, f"{ms:.1f}", f"{100 * ms / p['step_ms']:.0f}%"]
        return cells + ([f"{dev_ms:.1f}" if dev_ms is not None else "-"] if dev else [])

    rows = [row(k, v, dev.get(k)) for k, v in p["parts_ms"].items()]
    rows.append(row("other (batch gather, opacus' bookkeeping, Python)", p["other_ms"], None))
    header = ["part", "host ms", "share"] + (["device ms"] if dev else [])
    return (
        f"One dp_finetune step (step {p.get('step', 3)}) under torch.profiler, UNet "
        f"{p['widths']}, batch {p['batch']}, {p['device']}: {p['step_ms']:.0f} ms "
        f"({p['when']}).\n\n" + md_table(header, rows)
    )


def _device_name(device: torch.device) -> str:
    return "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)


def run(quick: bool = True) -> str:
    t = time.time()
    result = measure(
        rounds=5 if quick else 9
    )  # this machine's steps vary by 10-20%: the median of several
    return render(result, 100, time.time() - t)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="steps timed per method and round")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument(
        "--widths", default=",".join(map(str, WIDTHS)), help="UNet channels, e.g. 32,64,64"
    )
    parser.add_argument(
        "--only",
        default="",
        help="';'-separated parts of row names to measure (plus the plain step)",
    )
    parser.add_argument(
        "--all-rows", action="store_true", help="on the CPU too, the rows otherwise measured off it"
    )
    parser.add_argument("--json", type=Path, help="also write the rows as a JSON list to this file")
    parser.add_argument(
        "--profile", type=Path, help="instead: profile one step of dp_finetune, JSON to this file"
    )
    args = parser.parse_args()
    device, widths = torch.device(args.device), tuple(int(w) for w in args.widths.split(","))
    if args.profile:
        p = profile_loop(args.batch, device, widths)
        args.profile.write_text(json.dumps(p, indent=1))
        print(render_profile(p))
        return
    t = time.time()
    result = measure(
        args.batch,
        args.rounds,
        args.reps,
        device,
        widths,
        methods(device, args.only, args.all_rows),
    )
    print(render(result, args.batch, time.time() - t, device, widths))
    if args.json:
        args.json.write_text(json.dumps(rows_json(result, args.batch, device, widths), indent=1))


if __name__ == "__main__":
    main()
