"""Preloaded in every Dask worker process a `--workers` run starts (release/run_log.py): the
process's stderr, where its libraries print (distributed's logging, SimpleITK's C++ warnings, the
tracebacks of failed items), goes to the run's log file instead of the steward's console."""

from __future__ import annotations

import os
from typing import Any

LOG_ENV = "PRIVRELEASE_RUN_LOG"


def dask_setup(worker: Any) -> None:
    """Called by distributed when the worker starts (its preload hook)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 2)  # every writer of fd 2: Python's sys.stderr and C++ alike, children too
    os.close(fd)
