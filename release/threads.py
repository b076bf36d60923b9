"""How many CPU threads torch uses in a run: PRIVRELEASE_THREADS if set, else the cores that are
free now, looked at again while the run goes on.

torch starts one intra-op thread per core whether or not other processes keep those cores busy;
under contention its threads then wait on each other at every operation (issue 36: pre-training
3-6x slower than one thread on a busy 2-core machine; BENCHMARKS.md, "CPU threads under
contention"). Free cores = the cores this process may use (sched_getaffinity) minus the cores other
processes kept busy over a short sample of the kernel's CPU counters (/proc/stat, SAMPLE_S),
rounded, at least 1. The 1-minute load average used before lags by minutes: right after `make test`
it read 2.5 on two idle cores, and a whole `make demo` ran on one thread (issue 42). During a run
the runner looks again (`Rebalancer`, driven by the mechanism's progress callback) at each new
stage and every REBALANCE_S within one, over the CPU time used since its last look minus this
process's own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from accounting.errors import InvalidParameterError
from synth.progress import ProgressFn

ENV = "PRIVRELEASE_THREADS"
SAMPLE_S = 0.3  # the first look: long enough for tens of clock ticks per core, short beside a run
REBALANCE_S = 20.0  # later looks, within one stage
MIN_WINDOW_S = 2.0  # a stage change sooner than this after the last look keeps the count
# /proc/stat cpu line: user nice system idle iowait irq softirq steal (guest time is inside user)
_BUSY_FIELDS, _IDLE_FIELDS = (0, 1, 2, 5, 6, 7), (3, 4)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # None: torch's own default is kept (OMP_NUM_THREADS set by the user)
    reason: str
    adaptive: bool = False  # chosen from the free cores: looked at again during a run


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU time of the usable cores and of this process at one moment."""

    at: float  # time.monotonic()
    busy_s: float  # CPU seconds the usable cores spent working (every process)
    total_s: float  # CPU seconds the usable cores existed (working + idle)
    own_s: float  # this process's CPU seconds (all its threads)
    cores: int


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: containers and taskset narrow it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def sample() -> CpuSample | None:
    """The CPU counters of the cores this process may use, now; None where /proc/stat is absent."""
    try:
        cpus = os.sched_getaffinity(0)
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except (AttributeError, OSError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    busy = total = 0
    for line in lines:
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(v) for v in values[:8]]
        work = sum(ticks[i] for i in _BUSY_FIELDS)
        busy, total = busy + work, total + work + sum(ticks[i] for i in _IDLE_FIELDS)
    if total == 0:
        return None
    return CpuSample(time.monotonic(), busy / tick, total / tick, time.process_time(), len(cpus))


def busy_elsewhere(before: CpuSample, after: CpuSample) -> float:
    """How many of the usable cores other processes kept busy between two samples (this process's
    own CPU time taken out, so a run never counts itself)."""
    elapsed = after.at - before.at
    total = after.total_s - before.total_s
    if elapsed <= 0 or total <= 0:
        return 0.0
    busy_cores = after.cores * (after.busy_s - before.busy_s) / total
    own_cores = (after.own_s - before.own_s) / elapsed
    return max(0.0, min(float(after.cores), busy_cores - own_cores))


def free_cores(cores: int, busy: float) -> int:
    return max(1, min(cores, int(cores - busy + 0.5)))


def measure_busy(seconds: float = SAMPLE_S) -> float | None:
    """Cores other processes keep busy, over `seconds` from now (None: no /proc/stat)."""
    first = sample()
    if first is None:
        return None
    time.sleep(seconds)
    second = sample()
    return None if second is None else busy_elsewhere(first, second)


def choose(
    env: Mapping[str, str] | None = None,
    cores: int | None = None,
    busy: float | None = None,
) -> ThreadChoice:
    """The thread count for a run (pure given `env`, `cores` and `busy`: the cores other processes
    keep busy, measured over SAMPLE_S by default)."""
    env = os.environ if env is None else env
    value = env.get(ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise InvalidParameterError(
                f"{ENV}={value!r}: give a whole number of CPU threads >= 1, or unset it to let "
                "each run use the cores that are free."
            )
        return ThreadChoice(int(value), f"{ENV}={int(value)}")
    if env.get("OMP_NUM_THREADS", "").strip():
        return ThreadChoice(
            None, f"OMP_NUM_THREADS={env['OMP_NUM_THREADS'].strip()} (torch's own setting)"
        )
    cores = usable_cores() if cores is None else cores
    how = "now"
    if busy is None:
        busy = measure_busy()
    if busy is None:  # no /proc/stat (not Linux): the load average is the next best thing
        busy, how = os.getloadavg()[0], "by the 1-minute load average"
    free = free_cores(cores, busy)
    return ThreadChoice(
        free,
        f"{cores} cores, {busy:.1f} busy with other processes {how}: {free} free; looked at again "
        f"during the run; set {ENV} to choose",
        adaptive=True,
    )


_applied: ThreadChoice | None = None


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def apply() -> ThreadChoice:
    """Choose once per process and set torch's intra-op threads; later calls return the same
    choice (a run's Rebalancer changes the count from there)."""
    global _applied
    if _applied is None:
        choice = choose()
        if choice.threads is not None:
            _set_torch_threads(choice.threads)
        _applied = choice
    return _applied


class Rebalancer:
    """A progress callback that looks at the cores again during a run and resets torch's thread
    count when the free cores changed: at the first report of each new stage (pre-training, DP-SGD,
    sampling, vote rounds) and every `interval` seconds within one. Mechanisms report progress from
    the thread that computes, which is the thread whose count torch.set_num_threads sets. A change
    is reported as a one-line stage ("CPU threads: ...") through the wrapped callback."""

    def __init__(
        self,
        progress: ProgressFn,
        threads: int,
        interval: float = REBALANCE_S,
        set_threads: Callable[[int], None] = _set_torch_threads,
    ) -> None:
        self.progress, self.threads, self.interval = progress, threads, interval
        self.set_threads = set_threads
        self.stage: str | None = None
        self.last = sample()
        self.changes: list[tuple[int, float]] = []  # (threads, cores busy elsewhere)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.last is not None and (
            stage != self.stage or time.monotonic() - self.last.at >= self.interval
        ):
            self.look()
        self.stage = stage
        self.progress(stage, done, total)

    def look(self) -> None:
        now = sample()
        if now is None or self.last is None or now.at - self.last.at < MIN_WINDOW_S:
            return
        busy = busy_elsewhere(self.last, now)
        self.last = now
        free = free_cores(now.cores, busy)
        if free == self.threads:
            return
        self.set_threads(free)
        self.threads = free
        self.changes.append((free, busy))
        self.progress(f"CPU threads: {free} ({busy:.1f} of {now.cores} cores busy elsewhere)", 1, 1)


def rebalancing(progress: ProgressFn, choice: ThreadChoice) -> ProgressFn:
    """`progress`, looking at the cores again during the run when the count was chosen from them."""
    if not choice.adaptive or choice.threads is None:
        return progress
    return Rebalancer(progress, choice.threads)
