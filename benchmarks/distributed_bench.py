"""DP-SGD on 1 vs N CPU processes (torchrun, gloo) and the per-step communication cost.

    python -m benchmarks.distributed_bench [--nproc 1,2] [--steps 12]

Each setting runs the product's own `dp_finetune` (world_size = N: opacus' DPDDP and the lockstep
distributed Poisson sampler) on MNIST-5k at the demo's model size, under `torchrun --standalone`, with
the machine's cores split evenly between the processes (OMP_NUM_THREADS = cores / N). The
communication cost is the all-reduce that opacus' DistributedDPOptimizer does once per step (one
call per trainable tensor), timed alone on the same tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, md_table, today

DEMO_WIDTHS = (16, 32, 32)
N_IMAGES, BATCH, PHYSICAL = 1000, 64, 64


def _worker(out: Path, steps: int) -> None:
    """One rank: time `steps` DP-SGD steps (after 2 warm-up steps), then the per-step all-reduce."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from synth.kinds.datasets import load_source
    from synth.mechanisms.privimage.model import make_unet
    from synth.mechanisms.privimage.training import dp_finetune

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    data = load_source("builtin:mnist5k")
    x = torch.from_numpy(data.images[:N_IMAGES, None].astype(np.float32) / 127.5 - 1)
    y = torch.from_numpy(data.labels[:N_IMAGES].astype(np.int64))
    torch.manual_seed(0)
    model = make_unet(28, 1, 10, DEMO_WIDTHS, 1)
    stamps: list[float] = []
    q = 1 / -(-N_IMAGES // BATCH)
    with tempfile.TemporaryDirectory() as wd:
        dp_finetune(
            model,
            x,
            y,
            sample_rate=q,
            noise_multiplier=1.0,
            steps=steps + 2,
            batch_size=BATCH,
            max_physical_batch=PHYSICAL,
            max_grad_norm=1.0,
            lr=3e-4,
            ema_decay=0.999,
            train_timesteps=1000,
            seed=0,
            device=torch.device("cpu"),
            workdir=Path(wd),
            ckpt_every=10_000,
            on_resume=lambda s, d: None,
            progress=lambda s, d, t: stamps.append(time.perf_counter()),
            world_size=world,
        )
    per_step = (stamps[-1] - stamps[1]) / steps
    grads = [torch.randn_like(p) for p in model.parameters()]
    reduce_s = _time_all_reduce(grads) if world > 1 else 0.0
    if rank == 0:
        out.write_text(
            json.dumps(
                {
                    "world": world,
                    "step_s": per_step,
                    "allreduce_s": reduce_s,
                    "tensors": len(grads),
                    "mb": sum(g.numel() * 4 for g in grads) / 2**20,
                    "threads": torch.get_num_threads(),
                }
            )
        )
    dist.destroy_process_group()


def _time_all_reduce(grads: list, repeats: int = 20) -> float:
    """Seconds per step of DistributedDPOptimizer.reduce_gradients: one SUM all-reduce per tensor."""
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        for g in grads:
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
    dist.barrier()
    return (time.perf_counter() - start) / repeats


def measure(nproc: int, steps: int, threads: int | None = None) -> dict:
    """One torchrun job; `threads` per process (default: the cores split evenly)."""
    threads = threads or max(1, (os.cpu_count() or 1) // nproc)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "benchmarks.distributed_bench",
            "--worker",
            str(out),
            "--steps",
            str(steps),
        ]
        done = subprocess.run(
            cmd, env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def section(results: list[dict], steps: int) -> str:
    base = results[0]["step_s"]
    rows = [
        [
            r["world"],
            r["threads"],
            f"{r['step_s']:.2f}",
            f"{BATCH / r['step_s']:.0f}",
            f"{base / r['step_s']:.2f}x",
            f"{r['allreduce_s'] * 1e3:.1f}" if r["world"] > 1 else "-",
            f"{100 * r['allreduce_s'] / r['step_s']:.1f}%" if r["world"] > 1 else "-",
        ]
        for r in results
    ]
    r0 = results[-1]
    return (
        f"## Distributed DP-SGD (`python -m benchmarks.distributed_bench`)\n\n"
        f"{today()}, {machine()}. CPU only, gloo, `torchrun --standalone`. MNIST-5k ({N_IMAGES} images), "
        f"demo UNet {DEMO_WIDTHS} ({r0['mb']:.2f} MiB of float32 weights in {r0['tensors']} tensors), "
        f"expected batch {BATCH}, {steps} timed steps after 2 warm-up steps.\n\n"
        + md_table(
            [
                "processes",
                "threads each",
                "s / DP-SGD step",
                "examples / s",
                "speed-up",
                "all-reduce ms / step",
                "all-reduce share of a step",
            ],
            rows,
        )
    )


def run(
    quick: bool = True,
    nprocs: tuple[int, ...] = (1, 2),
    steps: int = 12,
    threads: int | None = None,
) -> str:
    load = os.getloadavg()[0]
    return section([measure(n, steps, threads) for n in nprocs], steps) + (
        f"\n\nLoad average when it started: {load:.1f} on {os.cpu_count()} cores (other jobs share the machine: "
        "a process count that takes a larger share of a contended machine can look faster than it would be alone)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--nproc", default="1,2", help="process counts to compare (comma-separated)"
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--threads", type=int, help="threads per process (default: cores / processes)"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.steps)
        return
    print(
        run(
            nprocs=tuple(int(n) for n in args.nproc.split(",")),
            steps=args.steps,
            threads=args.threads,
        )
    )


if __name__ == "__main__":
    main()
