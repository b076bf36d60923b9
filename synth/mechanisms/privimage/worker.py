"""One rank of a distributed PrivImage stage, started by torchrun
(synth/mechanisms/privimage/distributed.py):

    python -m torch.distributed.run --standalone --nproc-per-node N -m
    synth.mechanisms.privimage.worker JOB

JOB is the file the coordinating process wrote (stage, tensors, settings). Across hosts
(`release run --nnodes N --rdzv HOST:PORT`) every host's agent runs `... worker --nodes HELLO`
instead: one job after another from the coordinator, sent by rank 0 (synth/tools/nodes.py).
Workers never touch the ledger: rank 0 writes the write-ahead step counter, checkpoints and the
result file; the coordinator charges. Stages: "pretrain" (plain DDP, public data) and
"finetune_sample" (DP-SGD with opacus' DPDDP, then DDIM sampling split across ranks and gathered on
rank 0)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from accounting.errors import PrivReleaseError
from synth.mechanisms.privimage import distributed, state
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.sampling import sample_images
from synth.mechanisms.privimage.training import _pretrain_key, dp_finetune, pretrain_cached
from synth.progress import ProgressFn, no_progress
from synth.tools import nodes, step_counter


def _progress() -> ProgressFn:
    return distributed.report_progress if dist.get_rank() == 0 else no_progress


def _digest(weights: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode())
        h.update(weights[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _same_on_every_rank(weights: dict[str, torch.Tensor]) -> list[str]:
    """Every rank's weight digest; the ranks must agree (DDP/DPDDP keep replicas identical)."""
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, _digest(weights))
    if len(set(digests)) != 1:
        raise PrivReleaseError(
            f"Internal error: the ranks' models diverged ({digests}); nothing is released."
        )
    return digests


def _same_start(workdir: Path) -> None:
    """Every rank resumes DP-SGD from the same checkpoint step (across hosts, a follower's comes
    from the coordinator): ranks out of step would not run the same all-reduces."""
    saved = state.load_torch(workdir / state.FINETUNE)
    steps: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(steps, saved["step"] if saved is not None else 0)
    if len(set(steps)) != 1:
        raise PrivReleaseError(
            f"Internal error: the ranks would resume DP-SGD from different steps ({steps}); "
            "nothing is trained."
        )


def pretrain_stage(job: dict[str, Any], device: torch.device) -> dict[str, Any] | None:
    model = pretrain_cached(
        job["model"],
        job["x"],
        job["y"],
        cache_dir=job["cache_dir"],
        workdir_ckpt=Path(job["workdir_ckpt"]),
        device=device,
        progress=_progress(),
        world_size=dist.get_world_size(),
        **job["kwargs"],
    )
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    digests = _same_on_every_rank(weights)
    return {"weights": weights, "rank_digests": digests} if dist.get_rank() == 0 else None


def finetune_sample_stage(job: dict[str, Any], device: torch.device) -> dict[str, Any] | None:
    """DP-SGD (lost steps were charged by the coordinator before launch: on_resume does nothing),
    then this rank's share of the released images."""
    world, rank = dist.get_world_size(), dist.get_rank()
    _same_start(Path(job["workdir"]))
    outcome = dp_finetune(
        job["model"],
        job["x"],
        job["y"],
        device=device,
        workdir=Path(job["workdir"]),
        on_resume=lambda started, done: None,
        progress=_progress(),
        world_size=world,
        **job["finetune"],
    )
    digests = _same_on_every_rank(outcome.weights)
    model = make_unet(*job["unet"])
    model.load_state_dict(outcome.weights)
    s = dict(job["sample"])
    labels = np.asarray(s.pop("labels"))
    mine = distributed.split_positions(len(labels), rank, world)
    images = sample_images(
        model, labels[mine], device=device, progress=_progress(), **{**s, "seed": s["seed"] + rank}
    )
    gathered = distributed.gather_images(images, len(labels))
    if rank != 0 or gathered is None:
        return None
    return {
        "weights": outcome.weights,
        "steps": outcome.steps,
        "opacus_history": outcome.opacus_history,
        "opacus_sample_rate": outcome.opacus_sample_rate,
        "images": gathered,
        "rank_digests": digests,
    }


STAGES = {"pretrain": pretrain_stage, "finetune_sample": finetune_sample_stage}


def run_stage(job: dict[str, Any], device: torch.device) -> dict[str, Any] | None:
    return STAGES[job["stage"]](job, device)


def resume_files(job: dict[str, Any], world: int) -> dict[str, Path]:
    """The coordinator's files a stage resumes from, which a follower host's ranks need too (by
    their name in its private folder): DP-SGD's checkpoint and step counter; pre-training's cached
    model or partial checkpoint (the cache key includes the world size)."""
    if job["stage"] == "finetune_sample":
        work = Path(job["workdir"])
        return {
            f"work/{state.FINETUNE}": work / state.FINETUNE,
            f"work/{step_counter.FILE}": work / step_counter.FILE,
        }
    found = {f"work/{state.PRETRAIN}": Path(job["workdir_ckpt"])}
    if job["cache_dir"] is not None:
        settings = {**job["kwargs"], "world_size": world}
        key = _pretrain_key(job["model"], job["x"], job["y"], settings)
        for name in (f"pretrain-{key}.pt", f"pretrain-{key}.partial.pt"):
            found[f"cache/{name}"] = Path(job["cache_dir"]) / name
    return found


def localise(job: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """The job with its paths in a follower's private folder (where resume_files' files are)."""
    if job["stage"] == "finetune_sample":
        return {**job, "workdir": str(scratch / "work")}
    return {
        **job,
        "workdir_ckpt": str(scratch / "work" / state.PRETRAIN),
        "cache_dir": None if job["cache_dir"] is None else str(scratch / "cache"),
    }


def _init_device(kind: str) -> torch.device:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if kind.startswith("cuda"):
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def main(argv: list[str]) -> int:
    distributed.die_with_parent()
    if len(argv) == 2 and argv[0] == "--nodes":
        work = nodes.RankWork(run_stage, resume_files, localise, _init_device, state.save_torch)
        return nodes.worker_main(argv[1], work)
    if len(argv) != 1:
        print(
            "usage: python -m synth.mechanisms.privimage.worker JOB (started by torchrun for "
            "`privrelease release run --nproc N`; not run by hand)",
            file=sys.stderr,
        )
        return 2
    job = torch.load(argv[0], map_location="cpu", weights_only=False)
    device = distributed.init_from_env(job["device"])
    try:
        result = STAGES[job["stage"]](job, device)
        if result is not None:
            state.save_torch(Path(job["result"]), result)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
