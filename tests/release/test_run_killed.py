"""No release is left in a state that no command settles (issue 57): a `release run` killed after it
read the data (SIGKILL: no handler runs) used to leave the release `running`, which `release
abandon` refused, with its charge reserved for ever. Its lease names a holder that is gone, so
`release abandon` takes it over and settles the charge by the ledger's rules (what ran after
reading stays charged, nothing twice), and the audit trail still verifies. SIGTERM, what a service
manager sends, stops a run as Ctrl-C does."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from accounting import ledger, trail
from accounting.store import Store
from release import manager, runner, views
from release.spec import ReleaseSpec
from tests.support.cli import process_env, read_until, run_process, start_process, steward_store

GENERATOR = "DP-MERF generator"  # a progress stage after the data was read (the query before it)


def _approved(tmp_path: Path, steps: int = 1_000_000) -> tuple[Store, str]:
    store = steward_store(tmp_path)
    spec = {
        "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 20},
        "merf": {
            "epsilon": 4.0,
            "preset": "tiny",
            "steps": steps,  # by default far longer than the test waits: killed mid-training
            "teacher_labels": False,
            "perceptual_share": 0,
        },
    }
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    store.backend.release()  # the run's process opens the store next
    return store, rel.release_id


def _cli(store: Store, *args: str) -> subprocess.CompletedProcess:
    store.backend.release()
    return run_process(process_env(store.workspace.root), *args, timeout=300)


def _cli_here(store: Store, *args: str):
    """The same CLI command in this process (typer's runner): no second interpreter to start."""
    from typer.testing import CliRunner

    from release.cli import app

    store.backend.release()
    return CliRunner().invoke(app, ["--workspace", str(store.workspace.root), *args])


def _run_until(store: Store, release_id: str, trigger: str) -> tuple[subprocess.Popen, str]:
    """`privrelease release run` in its own process, returned (still running) once a progress line
    names `trigger`."""
    env = process_env(store.workspace.root)
    proc = start_process(env, "release", "run", release_id, "--as", "alice")
    return proc, read_until(proc, trigger)


def _actions(store: Store, release_id: str) -> list[str]:
    """The release's trail entries, oldest first (charges name their run id in `run_id`)."""
    return [
        e["action"]
        for e in reversed(trail.entries(store))
        if release_id in (e["payload"].get("release_id"), e["payload"].get("run_id"))
    ]


# Slow since issue 63 (end to end: a SIGKILLed CLI run; fast:
# test_a_run_killed_before_it_read_the_data_is_settled_without_a_charge,
# test_privimage_run.py::test_abandon_commits_query_and_started_steps)
@pytest.mark.slow
def test_a_run_killed_after_reading_the_data_is_settled_by_release_abandon(tmp_path) -> None:
    store, rid = _approved(tmp_path)
    proc, _ = _run_until(store, rid, GENERATOR)
    # while its holder lives, nothing else settles or runs it; the message says how to stop it
    with pytest.raises(runner.RunInProgressError) as alive:
        manager.abandon_release(store, rid, "alice")
    assert f"kill {proc.pid}" in str(alive.value) and f"release abandon {rid}" in str(alive.value)
    proc.kill()  # SIGKILL: no handler, no finally
    proc.wait(timeout=60)
    assert proc.stdout is not None
    proc.stdout.close()
    rel = manager.get_release(store, rid)
    status = views.run_status(store, rid)
    assert rel.state == "running" and status.accessed and status.charge.state == "reserved"
    reserved = status.charge.planned_events

    settled = _cli(store, "release", "abandon", rid, "--as", "alice")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert "Abandoned" in settled.stdout and "charge committed" in settled.stdout
    rel = manager.get_release(store, rid)
    assert rel.state == "failed" and "abandoned by alice (charge committed)" in rel.reason
    # the query ran on the data: charged once, in full; nothing else of this release is reserved
    [charge] = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith(rid)]
    assert charge.state == "committed" and charge.charged_events == reserved
    assert _actions(store, rid) == [
        "release.plan",
        "release.approve",
        "release.run",
        "budget.reserve",
        "run.sensitive_access",
        "run.lease_takeover",  # the dead holder's lease, taken over by abandon
        "budget.commit",
        "release.abandon",
    ]
    verified = _cli(store, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # settled for good: a new run cannot recompute it without a new charge
    again = _cli(store, "release", "run", rid, "--as", "alice")
    assert again.returncode == 2 and "already settled" in again.stderr, again.stderr
    assert ledger.get_charge(store, charge.run_id).state == "committed"


@pytest.mark.slow  # another run of half a minute; the SIGKILL test above covers the settling
def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path) -> None:
    store, rid = _approved(tmp_path)
    proc, _ = _run_until(store, rid, GENERATOR)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    text = " ".join(out.split())
    assert proc.returncode == 143, text
    assert f"Terminated (SIGTERM) during {GENERATOR}" in text and "Traceback" not in text
    assert f"privrelease release abandon {rid} --as alice" in text
    rel = manager.get_release(store, rid)
    assert rel.state == "failed" and rel.reason == "terminated (SIGTERM)"
    lease = store.query("SELECT token FROM run_leases WHERE run_id = ?", [rid])
    assert lease[0]["token"] is None  # given back: the next command needs no takeover
    manager.abandon_release(store, rid, "alice")
    [charge] = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith(rid)]
    assert charge.state == "committed"


def test_a_run_killed_before_it_read_the_data_is_settled_without_a_charge(tmp_path) -> None:
    """Killed at its first line (threads set, data loading): either it had not yet marked the
    release running (still approved, nothing reserved) or `release abandon` settles it; nothing
    stays charged either way."""
    store, rid = _approved(tmp_path)
    spent = ledger.budget(store, "mnist").spent_rdp
    proc, _ = _run_until(store, rid, "CPU threads")
    proc.kill()
    proc.wait(timeout=60)
    assert proc.stdout is not None
    proc.stdout.close()
    assert not views.run_status(store, rid).accessed
    if manager.get_release(store, rid).state == "approved":
        # killed before the run marked it running: nothing was reserved, and it still runs as
        # approved (or is rejected); nothing to settle
        assert not [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith(rid)]
    else:
        settled = _cli_here(store, "release", "abandon", rid, "--as", "alice")
        assert settled.exit_code == 0, settled.output + repr(settled.exception)
        assert manager.get_release(store, rid).state == "failed"
    charges = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith(rid)]
    assert all(c.state == "refunded" for c in charges), charges
    assert ledger.budget(store, "mnist").spent_rdp == spent
    assert "run.sensitive_access" not in _actions(store, rid)
    verified = _cli_here(store, "audit", "verify")
    assert verified.exit_code == 0, verified.output + repr(verified.exception)


@pytest.mark.slow  # a whole merf release and two audits: about a minute
def test_a_run_killed_during_its_audit_is_audited_again_by_release_run(tmp_path) -> None:
    """Killed after the charge was committed and the output saved, while the audit runs: `release
    run` audits it again (no second run, no second charge) and the release ends checked."""
    store, rid = _approved(tmp_path, steps=5)
    proc, _ = _run_until(store, rid, "audit:")
    proc.kill()
    proc.wait(timeout=60)
    assert proc.stdout is not None
    proc.stdout.close()
    [charge] = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith(rid)]
    assert charge.state == "committed"
    again = _cli(store, "release", "run", rid, "--as", "alice")
    assert again.returncode == 0, again.stdout + again.stderr
    assert manager.get_release(store, rid).state == "checked"
    charges = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith(rid)]
    assert [c.state for c in charges] == ["committed"]  # charged once
    assert _actions(store, rid).count("run.sensitive_access") == 1
    verified = _cli(store, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
