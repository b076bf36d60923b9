"""A run's log file, and what reaches the steward's console from the libraries a run uses (issue
66). Dask distributed logs in this process (its scheduler and nannies under `--workers`, its client
always) and in every worker process; left alone, its warnings and whole tracebacks land on the
steward's console. While a run's items run, every record of distributed goes to the run's log file
(`<release>/work/run.log`, tracebacks included) and nowhere else; the few events a steward should
see (a worker process killed, the scheduler lost) become one line of ours on `NOTICES`, which the
CLI prints and the log file keeps too (after the run, the libraries' records still go to the file:
see `RunLog.close`). Worker processes started here send their own stderr to the
same file (`release.worker_log`, preloaded in each), so what their libraries print (SimpleITK's
C++ warnings, distributed's "Compute Failed" blocks) is kept there as well."""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections import deque
from pathlib import Path

NOTICES = logging.getLogger("privrelease.run")  # one line per event, for the steward's console
LOG_NAME = "run.log"  # in the run's work folder
ROUTED = ("distributed", "tornado", "bokeh")  # libraries whose records go to the log file only

_KILLED = re.compile(r"Worker process (\d+) was killed by (?:signal (\d+)|unknown signal)")
_EXITED = re.compile(r"Worker process (\d+) exited with status (\d+)")
_RECENT_S = 120.0  # a worker's death explains an item lost this soon after it


def signal_words(sig: int | None) -> str:
    """'signal 9 (SIGKILL; likely out of memory)' and the like."""
    if sig is None:
        return "an unknown signal"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = "unknown signal"
    cause = "; likely out of memory" if sig == signal.SIGKILL else ""
    return f"signal {sig} ({name}{cause})"


def _console(handler: logging.Handler) -> bool:
    """A handler that writes to a terminal stream (not a file)."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


class _Notable(logging.Handler):
    """distributed's records that a steward should see, said as one line of ours."""

    def __init__(self, log: RunLog) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed library record is not worth a failure
            return
        if self.log.closing:  # the cluster stopping its own workers: no event of note
            return
        killed, exited = _KILLED.search(text), _EXITED.search(text)
        if killed:
            sig = int(killed.group(2)) if killed.group(2) else None
            line = f"a worker process (pid {killed.group(1)}) was killed by {signal_words(sig)}"
        elif exited:
            line = f"a worker process (pid {exited.group(1)}) exited with status {exited.group(2)}"
        else:
            return
        self.log.deaths.append((time.monotonic(), line))
        NOTICES.info("%s; it is restarted, and its item is retried.", line)


class _Appended(logging.Handler):
    """Each record appended to the file (not a StreamHandler: distributed's `silence_logs`
    lowers those, and must not lower this one)."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.DEBUG)
        self.path = path
        self.setFormatter(
            logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s: %(message)s")
        )

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except Exception:  # noqa: BLE001 - logging must not fail the run
            self.handleError(record)


class RunLog:
    """Routes distributed's logging of this process to `path` while open (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.deaths: deque[tuple[float, str]] = deque(maxlen=32)
        self.closing = False  # set while the executor stops its cluster
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))  # 0600
        self._file = _Appended(self.path)
        self._notable = _Notable(self)
        self._saved: list[str] = []
        # distributed gives several of its loggers a stderr handler of their own (the client's,
        # tornado's): those go, and every record reaches its package's handlers (the file and
        # the notices). Other handlers stay: each Nanny adds an in-memory one to its module's
        # logger for as long as it lives, and a run starting while an earlier cluster's nanny
        # is still alive must still see its worker deaths.
        known = logging.Logger.manager.loggerDict
        for name in sorted({*ROUTED, *known}):
            lib = logging.getLogger(name) if name in ROUTED else known.get(name)
            if not isinstance(lib, logging.Logger) or name.split(".")[0] not in ROUTED:
                continue
            if name in ROUTED:
                lib.handlers = [self._file, self._notable]
                lib.propagate = False
            else:
                lib.handlers = [h for h in lib.handlers if not _console(h)]
                lib.propagate = True
            self._saved.append(name)
        for name in ROUTED:
            logging.getLogger(name).setLevel(logging.INFO)
        NOTICES.addHandler(self._file)
        self._level = NOTICES.level
        NOTICES.setLevel(logging.DEBUG)  # the file keeps the tracebacks of failed items too

    def recent_death(self) -> str | None:
        """The last worker death seen lately (what lost an item's worker, most likely)."""
        if self.deaths and time.monotonic() - self.deaths[-1][0] < _RECENT_S:
            return self.deaths[-1][1]
        return None

    def close(self) -> None:
        """Our lines stop; the libraries' records keep going to this file, not back to stderr:
        a client's connection closes asynchronously (a lost scheduler's reconnection, cancelled,
        logs its traceback after the run stopped), and a later run routes them to its own."""
        for name in self._saved:
            logging.getLogger(name).removeHandler(self._notable)
        self._saved = []
        NOTICES.removeHandler(self._file)
        NOTICES.setLevel(self._level)
        self._file.close()
