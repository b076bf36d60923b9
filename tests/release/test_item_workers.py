"""Per-item work on Dask workers (issue 56, release/executor.py): face-deid (tiny preset) on 8 real
photos released by a LocalCluster of two worker processes equals one process byte for byte (deface
and reface on three synthetic heads likewise); a worker
killed mid-release still releases every photo exactly once; a coordinator killed mid-release is
resumed without redoing the photos it had finished; the ledger shows one charge each time. Real Dask
on localhost, started and stopped here (slow: worker processes import torch and load the models);
--workers is refused, before any charge, for a mechanism that declares no per-item work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from accounting import ledger
from accounting.errors import PrivReleaseError
from accounting.store import Store, Workspace
from release import runner
from release.executor import ITEMS_DIR, ExecutorChoice, ItemStore
from tests.support import face_workers as fw
from tests.support.heads import cohort, needs_templates

ROOT = Path(__file__).resolve().parents[2]
STAGE = "face-deid: photos"


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return fw.photos(tmp_path_factory.mktemp("photos") / "p")


@pytest.fixture(scope="module")
def one_process(photos, tmp_path_factory):
    """The reference: the same release in this process."""
    root = tmp_path_factory.mktemp("one")
    store = fw.workspace(root / "ws", photos)
    return fw.released_files(fw.run_face_deid(store, photos, "one", root / "work"))


def _charges(store, run_id: str) -> list[ledger.Charge]:
    return [c for c in ledger.budget(store, fw.DATASET).charges if c.run_id.startswith(run_id)]


@pytest.mark.slow
def test_two_workers_release_the_same_bytes_as_one_process(photos, one_process, tmp_path) -> None:
    store = fw.workspace(tmp_path / "ws", photos)
    bars: list[tuple[str, int, int]] = []
    result = fw.run_face_deid(
        store,
        photos,
        "two",
        tmp_path / "work",
        ExecutorChoice(workers=2),
        progress=lambda s, d, t: bars.append((s, d, t)),
    )
    assert fw.released_files(result) == one_process
    assert one_process["withheld"] == {2: "no face detected", 6: "no face detected"}
    # the progress bar counts items across the workers, one step per photo
    steps = [d for s, d, _ in bars if s == STAGE]
    assert steps == list(range(9))
    [charge] = _charges(store, "two")
    assert charge.state == "committed"
    # every photo saved in the run's folder before it counted
    [folder] = (tmp_path / "work" / ITEMS_DIR).iterdir()
    assert ItemStore(folder).done() == set(range(8))


@pytest.mark.slow
def test_a_worker_killed_mid_release_still_releases_every_photo_once(
    photos, one_process, tmp_path
) -> None:
    from distributed import LocalCluster

    store = fw.workspace(tmp_path / "ws", photos)
    killed: list[int] = []
    # no Client of the test's own: a second client in this process binds the executor's futures
    # to another event loop; the scheduler runs in this process and its state is read directly
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        pids = {a: w.pid for a, w in cluster.scheduler.workers.items()}  # address -> process

        def progress(stage: str, done: int, total: int) -> None:
            # from the first finished photo on, the first time a worker holds photos: kill it
            # (under load the scheduler may not have handed any out at the first report)
            if stage == STAGE and 1 <= done < total and not killed:
                state = dict(cluster.scheduler.workers)
                busy = {a: len(w.processing) for a, w in state.items() if w.processing}
                if busy:
                    victim = next(iter(busy))  # a worker with photos in hand
                    killed.append(busy[victim])
                    os.kill(pids[victim], signal.SIGKILL)

        result = fw.run_face_deid(
            store,
            photos,
            "killed",
            tmp_path / "work",
            ExecutorChoice(cluster=cluster.scheduler_address),
            progress=progress,
        )
    assert killed and killed[0] >= 1  # it died holding at least one photo
    assert fw.released_files(result) == one_process  # each photo released once, the same bytes
    [charge] = _charges(store, "killed")
    assert charge.state == "committed"


@pytest.mark.slow
def test_a_killed_coordinator_resumes_without_redoing_finished_photos(
    photos, one_process, tmp_path
) -> None:
    store = fw.workspace(tmp_path / "ws", photos)
    store.backend.release()  # the coordinator's process opens the store next
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRIVRELEASE_THREADS": "1"}
    args = [str(tmp_path / "ws"), str(tmp_path / "photos"), "resumed", str(work)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.face_workers", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"{STAGE} 3/"):
            break
        assert time.monotonic() < deadline, "".join(seen)
    else:
        raise AssertionError("".join(seen))
    proc.kill()  # SIGKILL: no handler runs, the lease is left behind
    proc.wait(timeout=60)
    proc.stdout.close()
    [folder] = (work / ITEMS_DIR).iterdir()
    finished = {i: ItemStore(folder).path(i).stat().st_mtime_ns for i in ItemStore(folder).done()}
    assert len(finished) >= 3
    [charge] = _charges(store, "resumed")
    assert charge.state == "reserved"  # the dead attempt's reservation stays in force

    bars: list[tuple[str, int, int]] = []
    result = fw.run_face_deid(
        store, photos, "resumed", work, progress=lambda s, d, t: bars.append((s, d, t))
    )
    assert fw.released_files(result) == one_process
    first = next(d for s, d, _ in bars if s == STAGE)
    assert first == len(finished)  # the resumed run starts from the photos already done
    for i, mtime in finished.items():  # and did not write them again
        assert ItemStore(folder).path(i).stat().st_mtime_ns == mtime
    # one charge, reserved once and committed once: no refund, no second attempt
    [charge] = _charges(store, "resumed")
    assert charge.run_id == "resumed" and charge.state == "committed"


def test_workers_are_refused_for_a_mechanism_without_per_item_work(tmp_path) -> None:
    from synth.kinds.datasets import uci_digits

    data = uci_digits().subset(np.arange(50))
    store = fw.workspace(tmp_path / "ws", fw.photos(tmp_path / "p"))
    with pytest.raises(PrivReleaseError, match="no per-item work.*face-deid.*Nothing was charged"):
        runner.run_charged(
            store,
            run_id="r",
            dataset=fw.DATASET,
            data=data,
            public=data,
            mechanism="privimage",
            config=None,
            plan=None,  # type: ignore[arg-type]
            workdir=tmp_path / "w",
            executor=ExecutorChoice(workers=2),
        )
    assert not _charges(store, "r")


def test_a_cluster_that_is_neither_address_nor_file_is_refused_before_any_charge(
    photos, tmp_path
) -> None:
    from accounting.errors import InvalidParameterError

    store = fw.workspace(tmp_path / "ws", photos)
    with pytest.raises(InvalidParameterError, match="neither a scheduler address.*Nothing was"):
        fw.run_face_deid(store, photos, "r", tmp_path / "w", ExecutorChoice(cluster="nowhere.json"))
    assert not _charges(store, "r")
    with pytest.raises(InvalidParameterError, match="give one"):
        ExecutorChoice(workers=2, cluster="tcp://localhost:8786")


@pytest.mark.slow
@needs_templates
@pytest.mark.parametrize("name", ["deface", "reface"])
def test_heads_on_two_workers_equal_one_process(name, tmp_path, monkeypatch) -> None:
    """deface and reface per head: a cohort of 3 synthetic heads released by two Dask workers is
    byte-identical to the same release in this process, one charge each."""
    from release.data import load_registered, register_from_source
    from release.planning import dataset_info
    from synth import registry
    from synth.kinds.datasets import load_data

    monkeypatch.setenv("PRIVRELEASE_CACHE", str(tmp_path / "cache"))  # the workers inherit it
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    register_from_source(store, "heads", str(cohort(tmp_path / "heads", 3)), 10.0, 1e-5)
    _, data = load_registered(store, "heads")
    mech = registry.get(name)
    public = load_data(mech.default_public)
    config = mech.make_config(
        {}, dataset_info(ledger.budget(store, "heads").dataset), None, "default"
    )

    def release(run_id: str, executor: ExecutorChoice) -> runner.RunResult:
        b = ledger.budget(store, "heads")
        return runner.run_charged(
            store,
            run_id=run_id,
            dataset="heads",
            data=data,
            public=public,
            mechanism=name,
            config=config,
            plan=mech.plan(config, dataset_info(b.dataset), b.history, public),
            workdir=tmp_path / run_id,
            acknowledge_non_dp=True,
            actor="alice",
            executor=executor,
        )

    one, two = release("one", ExecutorChoice()), release("two", ExecutorChoice(workers=2))
    assert one.output.volumes is not None and two.output.volumes is not None
    for a, b in zip(one.output.volumes.volumes, two.output.volumes.volumes, strict=True):
        assert a.data.tobytes() == b.data.tobytes() and np.array_equal(a.affine, b.affine)
    assert one.output.images.tobytes() == two.output.images.tobytes()
    for run_id in ("one", "two"):
        [charge] = [c for c in ledger.budget(store, "heads").charges if c.run_id == run_id]
        assert charge.state == "committed"
