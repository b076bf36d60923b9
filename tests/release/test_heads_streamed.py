"""Issue 56, scale: a release of N heads never holds more than a few at once on the coordinator,
end to end (registration, reface on this process, saving the release and its fingerprint, the
audit, publishing the bundle). Every `Volume` made (constructed, or unpickled from a run's item
file) is tracked by a weak reference, and the most alive at once is compared for two cohort sizes:
it must not grow with the number of heads (before this, a run held every released head, and the
audit every original and released pair)."""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import pytest

from synth.kinds.volume import Volume
from synth.mechanisms.deface_reface import admission
from tests.support.heads import cohort, needs_templates

pytestmark = [needs_templates, pytest.mark.slow]


class LiveVolumes:
    """The Volumes alive now and the most alive at once since `reset` (weak references: tracking
    keeps none alive)."""

    def __init__(self) -> None:
        # by id (a Volume is not hashable): dropped by the reference's callback when it dies
        self.alive: dict[int, weakref.ref[Volume]] = {}
        self.peak = 0

    def add(self, volume: Volume) -> None:
        key = id(volume)
        self.alive[key] = weakref.ref(volume, lambda _, key=key: self.alive.pop(key, None))
        self.peak = max(self.peak, len(self.alive))

    def reset(self) -> int:
        """Start a step: the volumes alive now (the public templates a process keeps)."""
        self.peak = len(self.alive)
        return self.peak


@pytest.fixture
def live(monkeypatch) -> LiveVolumes:
    tracker = LiveVolumes()
    made = Volume.__post_init__

    def post_init(self: Volume) -> None:
        made(self)
        tracker.add(self)

    def setstate(self: Volume, state: dict[str, Any]) -> None:  # unpickled: no __init__ runs
        self.__dict__.update(state)
        tracker.add(self)

    monkeypatch.setattr(Volume, "__post_init__", post_init)
    monkeypatch.setattr(Volume, "__setstate__", setstate, raising=False)
    return tracker


def _release_peaks(n: int, seed: int, tmp: Path, live: LiveVolumes, monkeypatch) -> dict[str, int]:
    """Register `n` synthetic heads, reface them and publish; the peak of live volumes of each
    step, beyond the volumes alive before it."""
    from typer.testing import CliRunner

    from release.cli import app

    heads = cohort(tmp / "heads", n, colin_only=True, seed=seed)
    monkeypatch.setenv("PRIVRELEASE_HOME", str(tmp / "ws"))
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(tmp.parent / "head-atlas-cache"))
    cli = CliRunner()
    peaks: dict[str, int] = {}

    def run(step: str, *args: str) -> str:
        before = live.reset()
        res = cli.invoke(app, list(args))
        assert res.exit_code == 0, res.output
        peaks[step] = live.peak - before  # the most the step held at once beyond those
        return res.output

    run("init", "init", "--steward", "alice")
    run(
        "register",
        *("dataset", "register", "heads", "--source", str(heads)),
        *("--epsilon", "10", "--delta", "1e-5", "--as", "alice"),
    )
    spec = tmp / "reface.toml"
    # 6 mm test heads: the face check loosened as in test_volumes_e2e
    spec.write_text(
        '[release]\ndataset = "heads"\nmechanism = "reface"\n[reface]\n'
        "[policy]\nvolume_max_face_correlation = 0.7\n"
    )
    run("plan", "release", "plan", str(spec), "--as", "alice")
    rid = json.loads(run("list", "release", "list", "--json", "--as", "alice"))[0]["release_id"]
    run("approve", "release", "approve", rid, "--as", "alice", "--acknowledge-non-dp")
    run("run", "release", "run", rid, "--as", "alice")  # the mechanism, the save, the audit
    released = sorted((tmp / "ws" / "artifacts" / rid / "volumes").glob("*.nii.gz"))
    assert len(released) == n
    run("publish", "release", "publish", rid, "--as", "alice")
    return peaks


def test_the_coordinator_holds_a_few_heads_whatever_their_number(
    tmp_path, live, monkeypatch
) -> None:
    # seeds whose 6 mm heads all pass registration's checks (some seeds make a face too small)
    small = _release_peaks(5, 0, tmp_path / "small", live, monkeypatch)
    large = _release_peaks(15, 2, tmp_path / "large", live, monkeypatch)
    # the same few heads at a time for 15 heads as for 5, at every step, and no more than the
    # plan's memory estimate counts (admission.HEADS_HELD); holding the heads whole made the run
    # hold 10 and 30 at once
    assert large["run"] >= 2  # the tracking sees the heads a run reads and releases
    assert large["run"] <= admission.HEADS_HELD, large
    for step in ("register", "run", "publish"):
        assert large[step] <= small[step], (step, small, large)
