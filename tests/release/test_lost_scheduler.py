"""A lost scheduler under `--cluster` (issue 66): one that cannot be reached at the start refuses
the run before anything is reserved; one killed mid-run (a real `dask scheduler` process, SIGKILL)
stops the run with a clear message, the finished items kept, and once a scheduler runs again the
release resumes from them and is charged once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accounting import ledger
from accounting.store import Store, Workspace
from release import executor, manager, views
from release.executor import DaskExecutor, ExecutorChoice, SchedulerLostError, map_items
from tests.support.cli import (
    ROOT,
    approved_merf_release,
    as_process,
    init_and_register,
    planned,
    process_env,
    run_process,
    start_process,
)
from tests.support.heads import admissible_cohort, needs_templates
from tests.support.items import nap

DASK = Path(sys.executable).parent / "dask"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_scheduler_refuses_the_run_before_anything_is_reserved(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(executor, "CONNECT_TIMEOUT_S", 2)  # the default waits 30 s
    store, rid = approved_merf_release(tmp_path)
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(Exception) as refused:
        manager.run_release(store, rid, "alice", executor=ExecutorChoice(cluster=address))
    assert f"Could not reach the Dask scheduler {address}" in str(refused.value)
    assert "Nothing was charged." in str(refused.value)
    assert not [c for c in ledger.budget(store, "mnist").charges if rid in c.run_id]
    assert manager.get_release(store, rid).state == "failed"  # runs again as it is


# ------------------------------------------------------------------ a real scheduler, killed
class Cluster:
    """A site's cluster: `dask scheduler` and one `dask worker`, real processes."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / "scheduler.json"
        self.file.unlink(missing_ok=True)
        env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False", "PYTHONPATH": str(ROOT)}
        quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.scheduler = subprocess.Popen(
            [DASK, "scheduler", "--scheduler-file", self.file, "--port", "0", "--no-dashboard"],
            **quiet,
        )
        deadline = time.monotonic() + 60
        while not self.file.exists():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        self.worker = subprocess.Popen(
            [DASK, "worker", "--scheduler-file", self.file, "--nthreads", "1", "--no-dashboard"],
            **quiet,
        )

    def kill_scheduler(self) -> None:
        self.scheduler.send_signal(signal.SIGKILL)
        self.scheduler.wait(30)

    def close(self) -> None:
        for p in (self.worker, self.scheduler):
            if p.poll() is None:
                p.kill()
            p.wait(30)


@pytest.mark.slow  # a scheduler and a worker start (about 15 s)
def test_a_scheduler_killed_mid_map_stops_it_at_once_with_the_items_kept(tmp_path) -> None:
    cluster = Cluster(tmp_path)
    ex = DaskExecutor(ExecutorChoice(cluster=str(cluster.file)), tmp_path / "work" / "run.log")
    seen: list[int] = []

    def progress(label: str, done: int, n: int) -> None:
        seen.append(done)
        if done == 3:
            cluster.kill_scheduler()

    started = time.monotonic()
    try:
        with pytest.raises(SchedulerLostError) as lost:
            map_items(
                ex, tmp_path / "work", nap, 0.3, list(range(10)), label="x", progress=progress
            )
    finally:
        ex.close()
        cluster.close()
    assert time.monotonic() - started < 60
    assert str(lost.value).startswith(
        f"The scheduler of the Dask cluster at {cluster.file} was lost while items were running"
    )
    assert "the 3 of 10 items finished are kept" in str(lost.value)
    assert "nothing is charged twice" in str(lost.value)


@needs_templates
@pytest.mark.slow  # a deface release of 6 heads on a real cluster, its scheduler killed: minutes
def test_a_release_whose_scheduler_died_resumes_on_a_new_one_charged_once(tmp_path) -> None:
    heads = admissible_cohort(tmp_path / "heads", 6, tmp_path.parent / "head-atlas-cache")
    env = process_env(tmp_path / "ws", tmp_path.parent / "head-atlas-cache")
    cli = as_process(env)
    init_and_register(cli, "heads", str(heads))
    toml = '[release]\ndataset = "heads"\nmechanism = "deface"\n[deface]\n'
    rid = planned(cli, tmp_path / "deface.toml", toml, "--acknowledge-non-dp")

    cluster = Cluster(tmp_path)
    try:
        run = start_process(
            env, "release", "run", rid, "--as", "alice", "--cluster", str(cluster.file)
        )
        assert run.stdout is not None
        out = []
        for line in run.stdout:
            out.append(line)
            if "deface (subjects): 2/6" in line or "deface (subjects): 3/6" in line:
                cluster.kill_scheduler()
                break
        rest, _ = run.communicate(timeout=300)
        text = "".join(out) + rest
    finally:
        cluster.close()
    assert run.returncode == 2, text
    flat = " ".join(text.split())
    assert "error: The scheduler of the Dask cluster at" in flat, text
    assert "items finished are kept" in flat and "Details:" in flat
    assert "Traceback" not in text and "distributed." not in text, text
    rel = manager.get_release(Store(Workspace(tmp_path / "ws")), rid)
    assert rel.state == "failed" and "SchedulerLostError" in rel.reason

    cluster = Cluster(tmp_path)  # the site's scheduler is back
    try:
        again = run_process(
            env, "release", "run", rid, "--as", "alice", "--cluster", str(cluster.file)
        )
    finally:
        cluster.close()
    assert again.returncode == 0, again.stdout + again.stderr
    store = Store(Workspace(tmp_path / "ws"))
    assert manager.get_release(store, rid).state == "checked"
    charges = [c for c in ledger.budget(store, "heads").charges if c.run_id.startswith(rid)]
    assert [c.state for c in charges] == ["committed"]  # charged once
    tried = views.attempts(store, rid)
    assert [a.outcome for a in tried] == ["failed", "checked"]
    assert 2 <= (tried[0].items_done or 0) < 6
    cli("audit", "verify")
