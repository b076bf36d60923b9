"""The CPU thread count a run gives torch (issue 36: torch's default was 3-6x slower on a busy machine)."""

import subprocess
import sys
from pathlib import Path

import pytest

from accounting.errors import InvalidParameterError
from release.threads import ENV, choose, usable_cores


def test_free_cores_follow_the_load():
    assert choose({}, cores=2, load=6.3).threads == 1  # a busy 2-core machine: one thread, not two
    assert choose({}, cores=16, load=0.2).threads == 16  # a quiet one: every core
    assert choose({}, cores=16, load=4.0).threads == 12
    assert choose({}, cores=8, load=40.0).threads == 1
    assert (
        "load average 6.3" in choose({}, cores=2, load=6.3).reason
        and ENV in choose({}, cores=2, load=6.3).reason
    )


def test_the_knob_wins_and_bad_values_are_refused():
    assert choose({ENV: "3"}, cores=2, load=9.0).threads == 3
    assert (
        choose({"OMP_NUM_THREADS": "4"}, cores=2, load=9.0).threads is None
    )  # the user's own setting stays
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(InvalidParameterError, match=f"{ENV}=.*whole number"):
            choose({ENV: bad})
    assert 1 <= usable_cores()


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
