"""A head file replaced on disk after the run checked the registered fingerprint and before the head
is read for its item (issue 56): the item that reads it refuses it, naming the file, in this process
and on two Dask workers that read the heads from the (here local, on a site shared) folder
themselves; the run fails after reading, so its reservation stays in force, and nothing of that
head is saved. The file is changed from the run's progress callback when the subjects' stage
starts: after the coordinator's check, before any head is handed out (no sleeping)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accounting import ledger
from accounting.errors import DatasetConflictError
from accounting.store import Store, Workspace
from release import runner
from release.data import load_registered, register_from_source
from release.executor import ITEMS_DIR, ExecutorChoice, ItemStore
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import load_data
from synth.kinds.nifti import read_volume, write_volume
from tests.support.heads import cohort, needs_templates

pytestmark = needs_templates
STAGE = "deface (subjects)"
CHANGED = "subject-01.nii.gz"


def _replace(path: Path) -> None:
    """Another head's content (one voxel more) under the same name."""
    vol = read_volume(path)
    data = vol.data.copy()
    data[5, 5, 5] += 1
    write_volume(vol.with_data(data), path)


@pytest.mark.parametrize(
    "executor",
    [ExecutorChoice(), pytest.param(ExecutorChoice(workers=2), marks=pytest.mark.slow)],
    ids=["this-process", "two-workers"],
)
def test_a_head_changed_after_the_check_is_refused(
    executor, tmp_path, head_atlas_cache, monkeypatch
) -> None:
    # the session's atlas cache; the workers inherit it
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(head_atlas_cache))
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    heads = cohort(tmp_path / "heads", 2)
    register_from_source(store, "heads", str(heads), 10.0, 1e-5)
    _, data = load_registered(store, "heads")  # the coordinator's check: every file read once
    mech = registry.get("deface")
    public = load_data(mech.default_public)
    b = ledger.budget(store, "heads")
    config = mech.make_config({}, dataset_info(b.dataset), None, "default")
    replaced: list[int] = []

    def progress(stage: str, done: int, total: int) -> None:
        if stage == STAGE and not replaced:  # the first report, before any head is handed out
            replaced.append(done)
            _replace(heads / CHANGED)

    with pytest.raises(DatasetConflictError) as refused:
        runner.run_charged(
            store,
            run_id="r",
            dataset="heads",
            data=data,
            public=public,
            mechanism="deface",
            config=config,
            plan=mech.plan(config, dataset_info(b.dataset), b.history, public),
            workdir=tmp_path / "work",
            progress=progress,
            acknowledge_non_dp=True,
            actor="alice",
            executor=executor,
        )
    assert replaced == [0]
    message = str(refused.value)
    assert str((heads / CHANGED).resolve()) in message
    assert "changed since" in message and "registered fingerprint" in message
    assert "reservation stays in force" in message and "Run the release again" in message
    [charge] = [c for c in ledger.budget(store, "heads").charges if c.run_id == "r"]
    assert charge.state == "reserved"  # read after on_sensitive_access: not refunded
    [folder] = (tmp_path / "work" / ITEMS_DIR).iterdir()
    assert 1 not in ItemStore(folder).done()  # nothing of the changed head was kept
