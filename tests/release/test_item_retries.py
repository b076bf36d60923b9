"""Retries that know what is transient (issue 66, release/retries.py), branch by branch, on real
executors: an item whose process died (a real forked child SIGKILLed), whose Dask worker was
SIGKILLed, or that timed out is handed out again, counted and said in one line; the same failure
twice, too many failures, a data error or a fault stops the run at once naming the item; the items
finished before the stop are kept, and a second map resumes without redoing them."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from accounting.errors import DataFormatError, ItemTimeoutError
from release.executor import DaskExecutor, ExecutorChoice, InProcess, ItemStore, map_items
from release.retries import ItemFailedError
from synth.tools.mri.registration import interruptible

LABEL = "deface (subjects)"


class Head:
    """An item with a name, as a registered head is."""

    def __init__(self, name: str) -> None:
        self.name = name


def flaky(config: tuple[str, dict[int, list[str]]], item: Head) -> str:
    """Item `i` fails its k-th attempt as `plan[i][k]` says (attempts counted in files, so that a
    worker process counts as this one does), else returns its name."""
    folder, plan = config
    i = int(item.name.split("-")[1])
    attempt = len(list(Path(folder).glob(f"{i}-*")))
    Path(folder, f"{i}-{attempt}").touch()
    how = plan.get(i, [])[attempt] if attempt < len(plan.get(i, [])) else None
    if how == "killed":  # a forked child killed as the out-of-memory killer does
        interruptible(lambda: os.kill(os.getpid(), signal.SIGKILL), 60.0, item.name)
    elif how == "worker":  # the worker process itself killed
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "timeout":
        raise ItemTimeoutError(f"{item.name}: the registration did not finish within 1 s")
    elif how == "data":
        raise DataFormatError(f"{item.name}: the image fits the template best upside down")
    elif how == "bug":
        raise KeyError("oops")
    return item.name


def _map(tmp_path: Path, plan: dict[int, list[str]], executor=None, n: int = 6):
    executor = executor or InProcess(2, tmp_path / "work" / "run.log")
    heads = [Head(f"sub-{i}") for i in range(n)]
    try:
        return map_items(
            executor,
            tmp_path / "work",
            flaky,
            (str(tmp_path / "tries"), plan),
            heads,
            label=LABEL,
            progress=lambda *a: None,
        )
    finally:
        executor.close()


@pytest.fixture
def notices(caplog):
    caplog.set_level(logging.INFO, "privrelease.run")
    return lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]


@pytest.fixture(autouse=True)
def tries(tmp_path):
    (tmp_path / "tries").mkdir()


def _attempts(tmp_path: Path, i: int) -> int:
    return len(list((tmp_path / "tries").glob(f"{i}-*")))


def test_a_killed_child_and_a_time_limit_are_retried_counted_and_said(tmp_path, notices) -> None:
    out = _map(tmp_path, {1: ["killed"], 4: ["timeout", "killed"]})
    assert list(out) == [f"sub-{i}" for i in range(6)]
    assert [_attempts(tmp_path, i) for i in range(6)] == [1, 2, 1, 1, 3, 1]
    assert notices() == [
        f"{LABEL}: sub-1 (item 2 of 6) retried (1 of 2): sub-1: the registration process was "
        "killed by signal 9 (SIGKILL; likely out of memory)",
        f"{LABEL}: sub-4 (item 5 of 6) retried (1 of 2): sub-4: the registration did not finish "
        "within 1 s",
        f"{LABEL}: sub-4 (item 5 of 6) retried (2 of 2): sub-4: the registration process was "
        "killed by signal 9 (SIGKILL; likely out of memory)",
    ]


def test_the_same_failure_twice_stops_the_run_naming_the_item_and_a_rerun_resumes(
    tmp_path, notices
) -> None:
    with pytest.raises(ItemFailedError) as stopped:
        _map(tmp_path, {3: ["killed", "killed"]})
    log = tmp_path / "work" / "run.log"
    assert str(stopped.value) == (
        f"{LABEL}: sub-3 (item 4 of 6) failed the same way twice (sub-3: the registration "
        "process was killed by signal 9 (SIGKILL; likely out of memory)). The run stopped; the "
        "3 of 6 items finished are kept, and `privrelease release run` resumes the release from "
        f"there. Details: {log}."
    )
    [folder] = (tmp_path / "work" / "items").iterdir()
    assert ItemStore(folder).done() == {0, 1, 2}
    assert "Traceback" in log.read_text() and "ProcessDiedError" in log.read_text()
    # resumed: the finished items are reused, not redone; item 3 gets its third try and succeeds
    assert list(_map(tmp_path, {3: ["killed", "killed"]})) == [f"sub-{i}" for i in range(6)]
    assert [_attempts(tmp_path, i) for i in range(6)] == [1, 1, 1, 3, 1, 1]


def test_a_limit_of_failures_of_different_kinds_stops_the_run(tmp_path) -> None:
    executor = InProcess(1)
    with pytest.raises(ItemFailedError, match=r"sub-2 \(item 3 of 6\) failed 2 times"):
        _map(tmp_path, {2: ["timeout", "killed"]}, executor)


def test_no_retries_stops_at_the_first_transient_failure(tmp_path) -> None:
    with pytest.raises(ItemFailedError, match=r"sub-0 \(item 1 of 6\) failed 1 times"):
        _map(tmp_path, {0: ["timeout"]}, InProcess(0))


def test_a_data_error_stops_the_run_at_once_with_its_own_message(tmp_path, notices) -> None:
    with pytest.raises(DataFormatError, match="sub-2: the image fits the template best upside"):
        _map(tmp_path, {2: ["data"]})
    assert _attempts(tmp_path, 2) == 1  # never retried
    assert notices() == [
        f"{LABEL}: the run stopped at sub-2 (item 3 of 6); the 2 of 6 items finished are kept, "
        "and `privrelease release run` resumes the release from there. Details: "
        f"{tmp_path / 'work' / 'run.log'}."
    ]


def test_a_fault_stops_the_run_naming_the_item_its_traceback_in_the_log(tmp_path) -> None:
    with pytest.raises(ItemFailedError) as stopped:
        _map(tmp_path, {5: ["bug"]})
    assert f"{LABEL}: sub-5 (item 6 of 6) failed (KeyError: 'oops')" in str(stopped.value)
    assert _attempts(tmp_path, 5) == 1
    text = (tmp_path / "work" / "run.log").read_text()
    assert "Traceback" in text and "KeyError: 'oops'" in text


def test_the_retries_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="--retries must be 0 to 10, got 11"):
        ExecutorChoice(workers=1, retries=11)


def test_a_lost_worker_is_retried_with_the_death_distributed_logged(
    tmp_path, notices, capfd
) -> None:
    """The Dask branch, fast: the nanny's record of a worker's death (through distributed's own
    logger, as the nanny logs it) becomes our line, and a real KilledWorker of that worker's
    item is retried, named with that death."""
    from distributed.scheduler import KilledWorker

    from release.retries import Retries
    from release.run_log import RunLog

    log = RunLog(tmp_path / "run.log")
    try:
        logging.getLogger("distributed.nanny").info("Worker process 4242 was killed by signal 9")
        logging.getLogger("distributed.nanny").warning("Restarting worker (status=running)")
        # the client's logger has a stderr handler of its own (distributed's logging config)
        logging.getLogger("distributed.client").error("Lost connection to scheduler")
        retries = Retries(2, LABEL, 24, log.path, log.recent_death, lambda: 7)
        retries.failed(6, Head("sub-07"), KilledWorker("item-x-6-1", None, 0))
    finally:
        log.close()
    assert notices() == [
        "a worker process (pid 4242) was killed by signal 9 (SIGKILL; likely out of memory); "
        "it is restarted, and its item is retried.",
        f"{LABEL}: sub-07 (item 7 of 24) retried (1 of 2): the worker running it died (a worker "
        "process (pid 4242) was killed by signal 9 (SIGKILL; likely out of memory))",
    ]
    text = (tmp_path / "run.log").read_text()
    assert "Restarting worker" in text and "Lost connection to scheduler" in text
    assert capfd.readouterr().err == ""  # nothing of distributed's on the console


def test_a_death_is_seen_while_an_earlier_clusters_nanny_still_holds_its_logger(
    tmp_path, notices
) -> None:
    """Each distributed Nanny adds an in-memory handler to the `distributed.nanny` logger for as
    long as it lives. A run's log opened while one is still there (an earlier cluster's nanny not
    yet collected, in the same process) used to take that logger off its package's handlers, and
    the worker deaths of the new run were never said (CI, 2026-12-03). The handler stays; the
    console handler distributed gives its client's logger does not."""
    from release.run_log import RunLog

    nanny = logging.getLogger("distributed.nanny")
    client = logging.getLogger("distributed.client")
    kept, console = logging.NullHandler(), logging.StreamHandler()
    nanny.addHandler(kept)
    client.addHandler(console)
    log = RunLog(tmp_path / "run.log")
    try:
        nanny.info("Worker process 4343 was killed by signal 9")
        assert kept in nanny.handlers and console not in client.handlers
    finally:
        log.close()
        nanny.removeHandler(kept)
    assert notices() == [
        "a worker process (pid 4343) was killed by signal 9 (SIGKILL; likely out of memory); "
        "it is restarted, and its item is retried."
    ]
    assert "Worker process 4343 was killed" in (tmp_path / "run.log").read_text()


@pytest.mark.slow  # two worker processes start (about 15 s); the test above covers the branch
def test_a_dask_worker_killed_under_an_item_is_restarted_and_the_item_retried(
    tmp_path, notices, capfd
) -> None:
    """distributed says nothing on the console: the kill and the retry are two lines of ours.
    The scheduler may hand back the lost item (KilledWorker) before the nanny has logged its
    worker's death; the death's line then follows the retry's, so the cluster is kept up a few
    seconds for it before it stops (a stopping cluster's workers are not "killed" events)."""
    log = tmp_path / "work" / "run.log"
    executor = DaskExecutor(ExecutorChoice(workers=1), log)
    heads = [Head(f"sub-{i}") for i in range(4)]
    config = (str(tmp_path / "tries"), {2: ["worker"]})
    try:
        out = map_items(
            executor, tmp_path / "work", flaky, config, heads, label=LABEL, progress=lambda *a: None
        )
        deadline = time.monotonic() + 15.0
        while len(notices()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        executor.close()
    assert list(out) == [f"sub-{i}" for i in range(4)]
    assert _attempts(tmp_path, 2) == 2
    lines = sorted(notices(), key=lambda line: not line.startswith("a worker process"))
    assert len(lines) == 2, (lines, log.read_text()[-3000:])
    assert "was killed by signal 9 (SIGKILL; likely out of memory); it is restarted" in lines[0]
    assert lines[1].startswith(f"{LABEL}: sub-2 (item 3 of 4) retried (1 of 2): the worker ")
    assert "distributed" not in capfd.readouterr().err
    assert "Restarting worker" in log.read_text()
