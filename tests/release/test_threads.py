"""The CPU thread count a run gives torch (issue 36: torch's default was 3-6x slower on a busy machine;
issue 42: chosen from what the cores do now, not the lagging load average, and looked at again during a run)."""

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from accounting.errors import InvalidParameterError
from release import threads
from release.threads import ENV, choose, usable_cores


def test_free_cores_follow_what_the_cores_do_now():
    assert choose({}, cores=2, busy=1.1).threads == 1  # a core kept busy elsewhere: one thread
    # issue 42: the load average still read 2.5 after `make test`, but the cores are idle now
    assert choose({}, cores=2, busy=0.1).threads == 2
    assert choose({}, cores=16, busy=0.2).threads == 16  # a quiet machine: every core
    assert choose({}, cores=16, busy=4.0).threads == 12
    assert choose({}, cores=8, busy=40.0).threads == 1
    c = choose({}, cores=2, busy=1.3)
    assert "1.3 busy with other processes now" in c.reason and ENV in c.reason and c.adaptive


def test_the_knob_wins_and_bad_values_are_refused():
    assert choose({ENV: "3"}, cores=2, busy=1.9).threads == 3
    assert not choose({ENV: "3"}).adaptive  # a fixed count is never changed during the run
    # the user's own setting stays
    assert choose({"OMP_NUM_THREADS": "4"}, cores=2, busy=1.9).threads is None
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(InvalidParameterError, match=f"{ENV}=.*whole number"):
            choose({ENV: bad})
    assert 1 <= usable_cores()


@contextmanager
def burning_a_core():
    """Another process keeping one of our cores busy (a tight loop) until the block ends."""
    cpu = min(os.sched_getaffinity(0))
    burner = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        time.sleep(0.3)  # started and spinning
        yield
    finally:
        burner.kill()
        burner.wait()


needs_two_cores = pytest.mark.skipif(
    usable_cores() < 2 or threads.sample() is None, reason="needs 2 usable cores and /proc/stat"
)


@needs_two_cores
def test_a_core_burnt_by_another_process_is_not_free():
    """The sample sees a process that started a moment ago (a load average would not yet)."""
    with burning_a_core():
        busy = threads.measure_busy()
        choice = choose({})
    assert busy is not None and busy >= 0.8  # other developers' work can only add to it
    assert choice.threads is not None and choice.threads <= usable_cores() - 1


@needs_two_cores
def test_this_process_never_counts_itself():
    """CPU time of the run's own threads is not "other processes": it is taken out of the busy
    cores, however much of a core the spinning thread gets on a busy machine."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    before = threads.sample()
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        deadline = time.monotonic() + 30
        while time.process_time() - before.own_s < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = threads.sample()
    finally:
        stop.set()
        spinner.join()
    assert before is not None and after is not None
    elapsed = after.at - before.at
    own_cores = (after.own_s - before.own_s) / elapsed
    all_busy = after.cores * (after.busy_s - before.busy_s) / (after.total_s - before.total_s)
    assert after.own_s - before.own_s >= 0.3  # the spinner ran
    assert threads.busy_elsewhere(before, after) == pytest.approx(max(0.0, all_busy - own_cores))
    assert threads.busy_elsewhere(before, after) < all_busy  # it was counted, then taken out


@needs_two_cores
def test_a_long_run_looks_again(monkeypatch):
    """Between stages (and every `interval` within one) the free cores are measured again over the
    time since the last look; the thread count follows and the change is reported as a stage."""
    monkeypatch.setattr(threads, "MIN_WINDOW_S", 0.3)
    reported, applied = [], []
    cores = usable_cores()
    rebalance = threads.Rebalancer(
        lambda *a: reported.append(a), cores, interval=0.3, set_threads=applied.append
    )
    with burning_a_core():
        rebalance("pre-training", 0, 10)
        time.sleep(0.6)
        rebalance("pre-training", 1, 10)  # a look within the stage
    assert applied and applied[-1] <= cores - 1 and rebalance.threads == applied[-1]
    assert any(stage.startswith("CPU threads: ") for stage, *_ in reported)
    assert ("pre-training", 1, 10) in reported  # the mechanism's own reports pass through
    # and back up once the cores are free again (the decision, given what the cores did)
    assert [threads.free_cores(2, busy) for busy in (2.0, 1.0, 0.4, 0.0)] == [1, 1, 2, 2]


def test_a_run_wraps_its_progress_only_when_the_count_was_chosen():
    progress = lambda *a: None  # noqa: E731
    assert threads.rebalancing(progress, choose({ENV: "2"})) is progress
    assert isinstance(
        threads.rebalancing(progress, choose({}, cores=2, busy=0.0)), threads.Rebalancer
    )


def test_a_run_applies_the_choice_to_torch(tmp_path):
    """In a fresh process (torch's pool is per process): the runner's apply() sets torch's thread count."""
    code = (
        "import torch; from release import threads; torch.set_num_threads(2); c = threads.apply(); "
        "print(torch.get_num_threads(), c.threads)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            ENV: "1",
        },
    ).stdout.split()
    assert out == ["1", "1"]
