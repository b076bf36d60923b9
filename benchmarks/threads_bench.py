"""Pre-training speed by torch thread count: torch's default against the choice of
release/threads.py.

`python -m benchmarks.threads_bench [--steps N] [--repeats R]`: each setting runs in a fresh process (the
thread pool is fixed at the first parallel op) a short pre-training of the demo UNet on public UCI
digits,
settings interleaved so that they see the same contention; prints one markdown row per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WORKER = r"""
import json, os, sys, tempfile, time
from pathlib import Path
import torch
from release import threads
setting, steps = sys.argv[1], int(sys.argv[2])
load = os.getloadavg()[0]
choice = threads.apply() if setting != "default" else None
from synth.kinds.datasets import uci_digits
from synth.mechanisms.privimage.config import DEMO_RECIPE
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.training import pretrain
d = uci_digits()
x = torch.from_numpy(d.images).float().div(127.5).sub(1).unsqueeze(1)
y = torch.from_numpy(d.labels)
torch.manual_seed(0)
model = make_unet(28, 1, 11, DEMO_RECIPE["unet_channels"], 1)
times = []
def progress(stage, done, total):
    times.append(time.perf_counter())
with tempfile.TemporaryDirectory() as tmp:
    pretrain(model, x, y, steps=steps, batch=DEMO_RECIPE["pretrain_batch"], lr=3e-4, train_timesteps=1000, seed=0,
             device=torch.device("cpu"), ckpt=Path(tmp) / "ckpt.pt", ckpt_every=10**9, progress=progress)
per_step = (times[-1] - times[1]) / (len(times) - 2)  # the first step warms up
print(json.dumps({"setting": setting, "threads": torch.get_num_threads(), "seconds_per_step": per_step,
                  "load_at_start": load, "reason": choice.reason if choice else "torch default"}))
"""


def run(setting: str, steps: int) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PRIVRELEASE_THREADS")
    }
    if setting.isdigit():
        env["PRIVRELEASE_THREADS"] = setting
    out = subprocess.run(
        [sys.executable, "-c", WORKER, setting, str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--settings", default="default,chosen,1,2")
    args = ap.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, {args.steps} steps"
    )
    print(
        "| run | setting | threads | s / step | load at start | reason |\n|---|---|---|---|---|---|",
        flush=True,
    )
    for r in range(args.repeats):
        for setting in args.settings.split(","):
            row = run(setting, args.steps)
            print(
                f"| {r + 1} | {setting} | {row['threads']} | {row['seconds_per_step']:.3f} | "
                f"{row['load_at_start']:.1f} | {row['reason']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
