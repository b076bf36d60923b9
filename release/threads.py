"""How many CPU threads torch uses in a run: PRIVRELEASE_THREADS if set, else the cores that are
free.

torch starts one intra-op thread per core whether or not other processes keep those cores busy;
under contention its threads then wait on each other at every operation (issue 36: pre-training 3-6x
slower than one thread on a busy 2-core machine; BENCHMARKS.md, "CPU threads under contention").
Free cores = the cores this process may use (sched_getaffinity) minus the 1-minute load average, at
least 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from accounting.errors import InvalidParameterError

ENV = "PRIVRELEASE_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # None: torch's own default is kept (OMP_NUM_THREADS set by the user)
    reason: str


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: containers and taskset narrow it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def choose(
    env: Mapping[str, str] | None = None, cores: int | None = None, load: float | None = None
) -> ThreadChoice:
    """The thread count for a run (pure: `env`, `cores` and `load` default to this machine's)."""
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
    load = os.getloadavg()[0] if load is None else load
    free = max(1, min(cores, int(cores - load + 0.5)))
    return ThreadChoice(
        free, f"{cores} cores, load average {load:.1f}: {free} free; set {ENV} to choose"
    )


_applied: ThreadChoice | None = None


def apply() -> ThreadChoice:
    """Choose once per process and set torch's intra-op threads; later calls return the same
    choice."""
    global _applied
    if _applied is None:
        choice = choose()
        if choice.threads is not None:
            import torch

            torch.set_num_threads(choice.threads)
        _applied = choice
    return _applied
