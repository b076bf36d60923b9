"""PrivImage on N processes: plain DDP pre-training, DP-SGD with opacus' DPDDP, DDIM sampling split
across ranks. The coordinating process (the runner's, which alone holds the lease and charges the
ledger) writes a job file, launches `torchrun --standalone --nproc-per-node N -m
synth.mechanisms.privimage.worker JOB` and reads back what rank 0 wrote.

Why the charged events are those of one process: each rank Poisson-samples its shard of the data
at the plan's rate q, so every record is included independently with probability q (one Poisson
sample of the whole set); rank 0 alone adds the Gaussian noise (opacus' DistributedDPOptimizer),
the ranks' clipped sums are added once by all-reduce; the number of logical steps is the plan's.
Rank 0 writes the same write-ahead step counter as a single process, before each step.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from accounting.errors import InvalidParameterError, PrivReleaseError
from synth.mechanisms.privimage import state
from synth.mechanisms.privimage.ddp import LockstepPoissonSampler as LockstepPoissonSampler
from synth.mechanisms.privimage.training import DpSgdOutcome
from synth.progress import ProgressFn
from synth.tools import step_counter
from synth.tools.nodes import EXEC_DYING_WITH_PARENT, NodePool

MAX_NPROC = 64
PROGRESS_TAG = "@@privrelease-progress"
LOG_TAIL_LINES = 30


# ------------------------------------------------------------------ inside a worker
def init_from_env(device: str) -> torch.device:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK):
    nccl with one GPU per local rank when the job runs on CUDA, gloo on CPU."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return torch.device("cuda", local)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def split_positions(n: int, rank: int, world_size: int) -> np.ndarray:
    """The indices of the released images rank `rank` samples (round-robin, so every rank gets
    about n / world_size of every class)."""
    return np.arange(rank, n, world_size)


def gather_images(images: np.ndarray, n: int) -> np.ndarray | None:
    """On rank 0, every rank's images put back in the order of the full label list (else None)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    parts: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(images, parts if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    out = np.empty((n, *parts[0].shape[1:]), dtype=parts[0].dtype)
    for r, part in enumerate(parts):
        out[split_positions(n, r, world)] = part
    return out


def report_progress(stage: str, done: int, total: int) -> None:
    """Rank 0's progress, one tagged line on stdout that the coordinator forwards to its progress
    bar."""
    print(f"{PROGRESS_TAG}\t{stage}\t{done}\t{total}", flush=True)


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies, so that no orphan keeps training (and
    writing the step counter) after the coordinator or torchrun's agent was killed."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# ------------------------------------------------------------------ in the coordinating process
def check_nproc(nproc: int, device: torch.device) -> None:
    """Refuse what cannot run, before anything is charged or read."""
    if not isinstance(nproc, int) or isinstance(nproc, bool) or not 1 <= nproc <= MAX_NPROC:
        raise InvalidParameterError(
            f"--nproc must be an integer from 1 to {MAX_NPROC}, got {nproc!r}."
        )
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        raise InvalidParameterError(
            f"--nproc {nproc} needs one GPU per process but this host has "
            f"{torch.cuda.device_count()}; use --nproc {torch.cuda.device_count()} or fewer, or "
            "choose the GPUs with CUDA_VISIBLE_DEVICES."
        )


def launch(
    stage: str,
    job: dict[str, Any],
    *,
    nproc: int,
    workdir: Path,
    progress: ProgressFn,
    pool: NodePool | None = None,
) -> dict[str, Any]:
    """Run `stage` of the worker on `nproc` processes under torchrun and return rank 0's result.
    The job file holds sensitive tensors: 0600 in the run's workdir, deleted afterwards. Raises
    PrivReleaseError (with the workers' last log lines) if any worker fails or is killed. With
    `pool` (`--nnodes`), the stage runs on the ranks of every host the pool started."""
    if pool is not None:
        return pool.run(stage, job, progress)
    job_path, result_path = workdir / f"dist_{stage}_job.pt", workdir / f"dist_{stage}_result.pt"
    log_path = workdir / f"dist_{stage}.log"
    result_path.unlink(missing_ok=True)
    fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        torch.save({**job, "stage": stage, "result": str(result_path)}, fh)
    try:
        rc, tail = _torchrun(job_path, nproc, log_path, progress)
    finally:
        job_path.unlink(missing_ok=True)
    if rc != 0 or not result_path.exists():
        raise PrivReleaseError(
            f"Distributed {stage} failed: torchrun exited with {rc} (a worker failed or was "
            f"killed). Last lines of {log_path}:\n"
            + "".join(tail)
            + "\nThe release is failed and its reservation stays in force. Run "
            "`privrelease release run REL` again to resume from its last checkpoint, or "
            "`privrelease release abandon REL` to settle it."
        )
    result = torch.load(result_path, map_location="cpu", weights_only=False)
    result_path.unlink()
    return result


# torchrun's agent, started through a tiny exec wrapper that first asks to die with this process
_EXEC_DYING_WITH_PARENT = EXEC_DYING_WITH_PARENT


def _torchrun(
    job_path: Path, nproc: int, log_path: Path, progress: ProgressFn
) -> tuple[int, deque]:
    cmd = [
        sys.executable,
        "-c",
        _EXEC_DYING_WITH_PARENT,
        str(os.getpid()),
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "synth.mechanisms.privimage.worker",
        str(job_path),
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(_threads_per_rank(nproc))),
    }
    tail: deque = deque(maxlen=LOG_TAIL_LINES)
    with (
        open(log_path, "w") as log,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        ) as proc,
    ):
        assert proc.stdout is not None  # stdout=PIPE
        try:
            for line in proc.stdout:
                if line.startswith(PROGRESS_TAG):
                    _, stage, done, total = line.rstrip("\n").split("\t")
                    progress(stage, int(done), int(total))
                    continue
                log.write(line)
                tail.append(line)
        except BaseException:
            proc.terminate()  # torchrun's agent stops its workers on SIGTERM
            proc.wait()
            raise
        return proc.wait(), tail


def _threads_per_rank(nproc: int) -> int:
    return max(1, (os.cpu_count() or 1) // nproc)


def lost_steps_before_launch(workdir: Path) -> tuple[int, int] | None:
    """(steps started, checkpoint step) when an earlier attempt left DP-SGD state behind: the
    coordinator charges the lost steps (ctx.charge_lost_steps) before the workers run again."""
    started = step_counter.started(workdir)
    if started == 0:
        return None
    saved = state.load_torch(workdir / state.FINETUNE)
    return started, (saved["step"] if saved is not None else 0)


def pretrain(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    kwargs: dict[str, Any],
    *,
    nproc: int,
    device: torch.device,
    cache_dir: Path | None,
    workdir: Path,
    progress: ProgressFn,
    pool: NodePool | None = None,
) -> torch.nn.Module:
    """training.pretrain_cached on `nproc` DDP processes (public data only); the cache key includes
    the world size, since DDP draws a different sequence of batches than one process."""
    job = {
        "model": model.cpu(),
        "x": x,
        "y": y,
        "kwargs": kwargs,
        "cache_dir": cache_dir,
        "workdir_ckpt": str(workdir / state.PRETRAIN),
        "device": device.type,
    }
    result = launch("pretrain", job, nproc=nproc, workdir=workdir, progress=progress, pool=pool)
    model.load_state_dict(result["weights"])
    return model.to(device).eval()


def finetune_and_sample(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    finetune: dict[str, Any],
    sample: dict[str, Any],
    unet: tuple,
    *,
    nproc: int,
    device: torch.device,
    ctx: Any,
) -> tuple[DpSgdOutcome, np.ndarray]:
    """DP-SGD and sampling on `nproc` processes. Steps an earlier attempt started but lost since its
    checkpoint are charged here, by the coordinator, before any worker runs (as dp_finetune's
    on_resume does in one process)."""
    lost = lost_steps_before_launch(ctx.workdir)
    if lost is not None:
        ctx.charge_lost_steps(*lost)
    job = {
        "model": model.cpu(),
        "x": x,
        "y": y,
        "finetune": finetune,
        "sample": sample,
        "unet": unet,
        "workdir": str(ctx.workdir),
        "device": device.type,
    }
    r = launch(
        "finetune_sample",
        job,
        nproc=nproc,
        workdir=ctx.workdir,
        progress=ctx.progress,
        pool=getattr(ctx, "node_pool", None),
    )
    return DpSgdOutcome(r["weights"], r["steps"], r["opacus_history"], r["opacus_sample_rate"]), r[
        "images"
    ]
