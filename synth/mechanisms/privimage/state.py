"""Files of a run's workdir. Small JSON files are written atomically (tmp + fsync + rename) so
that a crash leaves either the old or the new version, never a torn one."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import torch

PLAN = "plan.json"
DATA_ACCESSED = "data.accessed"  # written just before the first read of sensitive data
QUERY = "query.json"  # the noisy histogram (DP) and the selection derived from it
VOTE = "vote.json"  # the private vote's noisy counts (DP) and the candidates it kept
PRETRAIN = "pretrain.pt"
FINETUNE = "finetune.pt"
MODEL_DIR = "model"
SAMPLES = "samples.npz"
RESULT = "result.json"


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    return json.loads(path.read_text()) if path.exists() else default


def save_torch(path: Path, obj: Any) -> None:
    # a temporary name of this process's own: two processes saving the same file (two runs sharing
    # the public pre-training cache) must never write into, or rename, each other's half-written
    # file
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_torch(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None


def touch_durable(path: Path) -> None:
    with open(path, "w") as fh:
        fh.write("1")
        fh.flush()
        os.fsync(fh.fileno())
