"""Which item failures a run retries, and when it stops (issue 66).

A failure of where an item ran is transient: a process of its work killed (a registration child
the out-of-memory killer picked: `ProcessDiedError`), its Dask worker lost (`KilledWorker`), a time
limit fired (`ItemTimeoutError`). Such an item is handed out again, up to `limit` times (`release
run --retries`, default 2), each retry counted and said as one line. The same failure of the same
item twice means it is the item (a head that needs more memory than a worker has), and any other
failure is about the data (a DataFormatError, a refused orientation) or a fault to look into: the
run stops at once, naming the item. Finished items stay in the run's work folder, so `release run`
resumes where it stopped."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accounting.errors import PrivReleaseError, TransientError

DEFAULT_RETRIES = 2
NOTICES = logging.getLogger("privrelease.run")  # as release.run_log.NOTICES


@dataclass(frozen=True)
class Failed:
    """What an executor yields in place of an item's result when the item raised `error`."""

    error: BaseException


class ItemFailedError(PrivReleaseError):
    """The run stopped at one item (its message names it, why, and how to resume)."""


def _killed_worker(exc: BaseException) -> bool:
    try:
        from distributed.scheduler import KilledWorker
    except ImportError:  # pragma: no cover - a pinned dependency
        return False
    return isinstance(exc, KilledWorker)


def cause(exc: BaseException, recent_death: str | None = None) -> tuple[str | None, str]:
    """(the kind of a transient failure, or None; the failure in words)."""
    if isinstance(exc, TransientError):
        return exc.kind, str(exc)
    if _killed_worker(exc):
        why = f" ({recent_death})" if recent_death else ""
        return "worker lost", f"the worker running it died{why}"
    if isinstance(exc, PrivReleaseError):
        return None, str(exc)
    return None, f"{type(exc).__name__}: {exc}"


def item_name(item: Any, index: int, n: int) -> str:
    name = getattr(item, "name", None)
    return f"{name} (item {index + 1} of {n})" if name else f"item {index + 1} of {n}"


@dataclass
class Retries:
    """The retry decisions of one map: `failed` either counts a retry (the caller hands the item
    out again) or raises, stopping the run."""

    limit: int
    label: str
    n: int
    log: Path | None = None
    recent_death: Callable[[], str | None] = lambda: None
    done: Callable[[], int] = lambda: 0
    retried: int = 0
    kinds: dict[int, list[str]] = field(default_factory=dict)

    def kept(self) -> str:
        return (
            f"the {self.done()} of {self.n} items finished are kept, and `privrelease release "
            "run` resumes the release from there"
        )

    def details(self) -> str:
        return f" Details: {self.log}." if self.log is not None else ""

    def failed(self, index: int, item: Any, exc: BaseException) -> None:
        kind, words = cause(exc, self.recent_death())
        name = item_name(item, index, self.n)
        NOTICES.debug("%s: %s failed", self.label, name, exc_info=exc)  # the log file's traceback
        seen = self.kinds.setdefault(index, [])
        if kind is not None and kind not in seen and len(seen) < self.limit:
            seen.append(kind)
            self.retried += 1
            NOTICES.info(
                "%s: %s retried (%d of %d): %s", self.label, name, len(seen), self.limit, words
            )
            return
        kept, where = self.kept(), self.details()
        if kind is None and isinstance(exc, PrivReleaseError):  # about the data: it names it
            NOTICES.info("%s: the run stopped at %s; %s.%s", self.label, name, kept, where)
            raise exc
        if kind is None:
            stop = f"{self.label}: {name} failed ({words}). The run stopped there"
        elif kind in seen:
            stop = f"{self.label}: {name} failed the same way twice ({words}). The run stopped"
        else:
            stop = f"{self.label}: {name} failed {len(seen) + 1} times ({words}). The run stopped"
        raise ItemFailedError(f"{stop}; {kept}.{where}") from exc
