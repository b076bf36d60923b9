"""Ctrl-C during `privrelease release run` (issue 36): a real process sent SIGINT says what happened, what
is charged and how to go on, and leaves the store consistent (state failed, lease free, charge as the
runner's failure rule says)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from accounting import ledger, trail
from accounting.store import Store
from release import manager, views
from release.spec import ReleaseSpec
from tests.support.cli import process_env, read_until, start_process, steward_store

pytestmark = pytest.mark.slow


def _approved(tmp_path: Path, **privimage) -> tuple[Store, str]:
    store = steward_store(tmp_path)
    spec = {
        "release": {"dataset": "mnist", "mechanism": "privimage", "n_images": 20},
        "privimage": {
            "epsilon": 4.0,
            "preset": "tiny",
            "public": "builtin:uci-digits",
            "k": 1,
            **privimage,
        },
    }
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    return store, rel.release_id


def _run_until(store: Store, release_id: str, trigger: str) -> tuple[int, str]:
    """`privrelease release run` in its own process; SIGINT as soon as a progress line names `trigger`."""
    root = store.workspace.root
    proc = start_process(
        process_env(root, root / "cache"), "release", "run", release_id, "--as", "alice"
    )
    seen = read_until(proc, trigger, timeout=600)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=300)
    return proc.returncode, " ".join((seen + rest).split())


def _lease_free(store: Store, release_id: str) -> bool:
    return (
        store.query("SELECT token FROM run_leases WHERE run_id = ?", [release_id])[0]["token"]
        is None
    )


def test_ctrl_c_before_reading_data_refunds_and_says_how_to_run_again(tmp_path):
    store, rid = _approved(
        tmp_path, classifier_epochs=400
    )  # the public classifier: long, before any data is read
    code, out = _run_until(store, rid, "query classifier:")
    assert code == 130, out
    assert (
        "Interrupted (Ctrl-C) during query classifier" in out and f"release {rid} is failed" in out
    )
    assert "Charged: nothing" in out and "reservation was refunded" in out
    assert f"privrelease release run {rid} --as alice" in out and "Traceback" not in out
    rel = manager.get_release(store, rid)
    assert rel.state == "failed" and rel.reason == "interrupted (Ctrl-C / SIGINT)"
    [charge] = ledger.budget(store, "mnist").charges
    refunds = [
        e["payload"]["reason"] for e in trail.entries(store) if e["action"] == "budget.refund"
    ]
    assert charge.state == "refunded" and refunds == [
        "failed before reading sensitive data: interrupted (Ctrl-C / SIGINT)"
    ]
    assert _lease_free(store, rid)


def test_ctrl_c_after_reading_data_keeps_the_reservation_and_names_resume_and_abandon(tmp_path):
    store, rid = _approved(
        tmp_path, finetune_epochs=20.0
    )  # thousands of DP-SGD steps: interrupted mid-way
    code, out = _run_until(store, rid, "DP fine-tuning:")
    assert code == 130, out
    assert "Interrupted (Ctrl-C) during DP fine-tuning" in out and f"release {rid} is failed" in out
    assert "it had read the sensitive data" in out and "stays in force" in out
    assert (
        f"Resume (from its last checkpoint; steps lost since then are charged again first): "
        f"privrelease release run {rid} --as alice" in out
    )
    assert f"privrelease release abandon {rid} --as alice" in out
    rel = manager.get_release(store, rid)
    assert (
        rel.state == "failed"
        and rel.reason == "interrupted (Ctrl-C / SIGINT)"
        and _lease_free(store, rid)
    )
    status = views.run_status(store, rid)
    assert status.accessed and status.charge.state == "reserved"
    assert 0 < status.started_steps < status.planned_steps
    assert f"{status.started_steps} of {status.planned_steps} DP-SGD steps were started" in out
    # the printed settle command settles it as the runner's rule says: started steps charged, the rest refunded
    manager.abandon_release(store, rid, "alice")
    charge = ledger.get_charge(store, status.charge.run_id)
    dpsgd = [e for e in charge.charged_events if getattr(e, "steps", None)]
    assert charge.state == "committed" and dpsgd[0].steps == status.started_steps
