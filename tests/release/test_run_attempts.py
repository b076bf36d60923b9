"""State that tells the truth (issue 66): a release that failed and was then run to success shows
no stale failure reason (it showed `EOFError:` on a checked release), and its attempts (when, how
each ended, its items) are in `release show` and its JSON. Real deface runs of three synthetic
heads through the command line."""

from __future__ import annotations

import json

import pytest

from accounting.store import Store
from release import attempts, manager, views
from release.artifacts import release_dir
from release.executor import ItemStore
from tests.support.cli import (
    approved_merf_release,
    in_process,
    init_and_register,
    planned,
)
from tests.support.heads import cohort, needs_templates


def _attempt_starts(store: Store, rid: str) -> None:
    """What `run_release` records when an attempt starts (the state machine's own transition)."""
    manager._set_state(
        store, rid, manager.RUNNABLE, "running", "alice", "release.run", {}, reason=""
    )


def test_attempts_are_read_from_the_trail_with_their_items_and_retries(tmp_path) -> None:
    """Fast, on the store's own transitions: a stopped attempt records where its items stood, one
    that died leaves no end, and the reason is cleared once the release runs again."""
    store, rid = approved_merf_release(tmp_path)
    items = ItemStore(release_dir(store, rid) / "work" / "items" / "deface_head-0")
    items.note_map("deface (subjects)", 24)
    _attempt_starts(store, rid)
    for i in range(5):
        items.save(i, i)
    items.note_retry(3, "ProcessDiedError")
    manager._fail(store, rid, "alice", "ItemFailedError: sub-06 failed the same way twice")
    assert manager.get_release(store, rid).reason.startswith("ItemFailedError")
    _attempt_starts(store, rid)  # a second attempt, killed with no record
    assert manager.get_release(store, rid).reason is None  # not stale while it runs again
    _attempt_starts(store, rid)
    for i in range(5, 9):
        items.save(i, i)
    items.note_retry(7, "KilledWorker")
    items.note_retry(8, "KilledWorker")
    manager._fail(store, rid, "alice", "interrupted (Ctrl-C / SIGINT)")
    tried = views.attempts(store, rid)
    assert [(a.number, a.outcome, a.items_done, a.items_total, a.retries) for a in tried] == [
        (1, "failed", 5, 24, 1),
        (2, "died", None, None, None),
        (3, "failed", 9, 24, 2),
    ]
    assert tried[0].reason == "ItemFailedError: sub-06 failed the same way twice"
    assert tried[1].reason == "no record (killed?)" and tried[1].ended_at is None
    assert (
        tried[2]
        .describe()
        .endswith(": failed, 9 of 24 items done, 2 retried: interrupted (Ctrl-C / SIGINT)")
    )
    assert attempts.progress(release_dir(store, rid) / "work") == {
        "items_done": 9,
        "items_total": 24,
        "retries": 3,
    }


@needs_templates
@pytest.mark.slow  # two deface runs of three heads and an audit: about a minute
def test_a_failed_then_successful_release_shows_its_attempts_not_a_stale_reason(
    tmp_path, monkeypatch
) -> None:
    heads = cohort(tmp_path / "heads", 3, colin_only=True)
    run = in_process(monkeypatch, tmp_path / "ws", tmp_path.parent / "head-atlas-cache")
    init_and_register(run, "heads", str(heads))
    toml = '[release]\ndataset = "heads"\nmechanism = "deface"\n[deface]\n'
    rid = planned(run, tmp_path / "deface.toml", toml, "--acknowledge-non-dp")
    missing = tmp_path / "no-such-scheduler.json"
    run("release", "run", rid, "--as", "alice", "--cluster", str(missing), ok=False)
    [listed] = json.loads(run("release", "list", "--json", "--as", "alice"))
    assert listed["state"] == "failed" and "neither a scheduler address" in listed["reason"]

    run("release", "run", rid, "--as", "alice")
    [listed] = json.loads(run("release", "list", "--json", "--as", "alice"))
    assert listed["state"] == "checked" and listed["reason"] is None  # no stale reason
    shown = json.loads(run("release", "show", rid, "--json"))
    first, second = shown["attempts"]
    assert first["outcome"] == "failed" and "neither a scheduler address" in first["reason"]
    assert (first["items_done"], first["items_total"]) == (0, 0)  # stopped before any item
    assert second["outcome"] == "checked" and second["reason"] is None
    text = " ".join(run("release", "show", rid).split())
    assert "attempt 1 at " in text and ": failed: InvalidParameterError: --cluster" in text
    assert "attempt 2 at " in text and ": checked" in text
    assert "reason:" not in text
