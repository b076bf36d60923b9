"""The write-ahead DP-SGD step counter of a run's workdir: a step is counted, durably, before it
runs, so a run that crashes mid-step is charged for it (the runner reads the count when it settles;
ARCHITECTURE.md, privacy rule 2). One file, written atomically (tmp + fsync + rename): a crash
leaves the old count or the new one, never a torn file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE = "dpsgd_wal.json"


def read(workdir: Path) -> dict[str, Any]:
    """{"started": steps counted so far, ...}; a fresh count when the file is absent."""
    path = Path(workdir) / FILE
    return json.loads(path.read_text()) if path.exists() else {"started": 0}


def started(workdir: Path) -> int:
    return int(read(workdir)["started"])


def write(workdir: Path, counter: dict[str, Any]) -> None:
    path = Path(workdir) / FILE
    tmp = path.with_name(FILE + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(counter, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def step_started(workdir: Path) -> int:
    """Durably count one more step as started (before it runs); returns the new count."""
    counter = read(workdir)
    counter["started"] = int(counter["started"]) + 1
    write(workdir, counter)
    return counter["started"]
