"""The attempts of a release's run, as its audit trail records them (issue 66): when each began,
how it ended (failed and why, synthesised, checked, or died with no record), how many items were
finished then and how many were retried. `release show` and the dashboard show them, so that a
release that failed and then ran to success keeps its history, not a stale reason. Derived from
the trail (each `release.fail` entry records the run's item counts), so no store table changes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from accounting.store import Store
from release.artifacts import release_dir
from release.executor import ITEMS_DIR, ItemStore

ACTIONS = ("release.run", "release.fail", "release.synthesised", "release.audit")


@dataclass(frozen=True)
class Attempt:
    number: int
    started_at: str
    ended_at: str | None  # None: still running, or died with no record (killed, power lost)
    outcome: str  # running | died | failed | synthesised | checked
    reason: str | None = None
    items_done: int | None = None  # finished items when it ended (all: when it succeeded)
    items_total: int | None = None
    retries: int | None = None  # items handed out again in this attempt

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        items = f", {self.items_done} of {self.items_total} items done" if self.items_total else ""
        retried = f", {self.retries} retried" if self.retries else ""
        why = f": {self.reason}" if self.reason else ""
        return (
            f"attempt {self.number} at {self.started_at[:19]}: {self.outcome}{items}{retried}{why}"
        )


def progress(workdir: Path) -> dict[str, int]:
    """The items of a run's work folder now: finished, in all, and retries so far (every map)."""
    done = total = retried = 0
    for folder in sorted((Path(workdir) / ITEMS_DIR).glob("*")):
        if folder.is_dir():
            items = ItemStore(folder)
            done, total = done + len(items.done()), total + items.noted_total()
            retried += items.noted_retries()
    return {"items_done": done, "items_total": total, "retries": retried}


def fail_payload(store: Store, release_id: str, reason: str) -> dict[str, Any]:
    """The trail payload of a failed attempt: its reason and where its items stood."""
    return {"reason": reason, **progress(release_dir(store, release_id) / "work")}


def history(store: Store, release_id: str) -> list[Attempt]:
    """The release's attempts, oldest first."""
    rows = store.query(
        "SELECT seq, ts, action, payload FROM audit_trail WHERE action IN (?, ?, ?, ?) "
        "AND payload LIKE ? ORDER BY seq",
        [*ACTIONS, f"%{release_id}%"],
    )
    out: list[Attempt] = []
    open_: Attempt | None = None
    retried_before = 0
    for row in rows:
        payload = json.loads(row["payload"])
        if payload.get("release_id") != release_id:
            continue
        action, ts = row["action"], row["ts"]
        if action == "release.run":
            if open_ is not None:  # the previous attempt left no end: its process died
                out.append(replace(open_, outcome="died", reason="no record (killed?)"))
            open_ = Attempt(len(out) + 1, ts, None, "running")
            continue
        if open_ is None:  # an audit run again on its own (the synthesis was settled before)
            open_ = Attempt(len(out) + 1, ts, None, "running")
        if action == "release.synthesised":
            open_ = replace(open_, outcome="synthesised")
            continue
        if action == "release.fail":
            retried = int(payload.get("retries", 0))
            open_ = replace(
                open_,
                ended_at=ts,
                outcome="failed",
                reason=payload.get("reason"),
                items_done=payload.get("items_done"),
                items_total=payload.get("items_total"),
                retries=max(0, retried - retried_before) if "retries" in payload else None,
            )
            retried_before = retried if "retries" in payload else retried_before
        else:  # release.audit: the release is checked
            open_ = replace(open_, ended_at=ts, outcome="checked")
        out.append(open_)
        open_ = None
    if open_ is not None:
        out.append(open_)
    return out
