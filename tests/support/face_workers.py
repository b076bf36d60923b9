"""A face-deid workspace for the executor tests (helpers, not tests): real photos (tests/support/
face_photos.py, each twice: 8 records), registered in a throw-away workspace, and a run of face-deid
through the runner with the plan it would be approved with.

`python -m tests.support.face_workers WORKSPACE PHOTOS RUN_ID WORKDIR [WORKERS]` runs one release
as its own coordinator process (the coordinator-kill test kills it) and prints each progress step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from accounting import ledger
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from release import runner
from release.executor import ExecutorChoice
from release.planning import dataset_info
from synth.kinds.datasets import ImageDataset, load_source
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.run import MECHANISM
from synth.progress import ProgressFn, no_progress

DATASET = "faces"


def photos(folder: Path) -> ImageDataset:
    """The four photos (two portraits, a cup, two faces side by side), each twice."""
    from tests.support import face_photos

    if not folder.exists():
        face_photos.write_folder(folder)
    one = load_source(f"photos-192:{folder}")
    return ImageDataset(
        np.concatenate([one.images, one.images]),
        np.concatenate([one.labels, one.labels]),
        one.class_names,
        one.source,
        one.declared_labels,
    )


def workspace(root: Path, data: ImageDataset) -> Store:
    ws = Workspace(root)
    ws.init()
    store = Store(ws)
    ledger.register_dataset(
        store,
        name=DATASET,
        source="photos-192:/somewhere",
        fingerprint=dataset_fingerprint(ws.hmac_key(), data.images, data.labels),
        record_count=len(data),
        labels=[0],
        image_shape=list(data.image_shape),
        epsilon_cap=8.0,
        delta_cap=1e-5,
    )
    return store


def run_face_deid(
    store: Store,
    data: ImageDataset,
    run_id: str,
    workdir: Path,
    executor: ExecutorChoice = ExecutorChoice(),
    progress: ProgressFn = no_progress,
) -> runner.RunResult:
    """face-deid (tiny preset) on `data`, charged to the workspace's ledger."""
    config = FaceDeidConfig.tiny()
    b = ledger.budget(store, DATASET)
    pub = None  # face-deid reads no public data unless the spec names a donor pool
    plan = MECHANISM.plan(config, dataset_info(b.dataset), b.history, pub)
    return runner.run_charged(
        store,
        run_id=run_id,
        dataset=DATASET,
        data=data,
        public=pub,
        mechanism=MECHANISM,
        config=config,
        plan=plan,
        workdir=workdir,
        acknowledge_non_dp=True,
        actor="alice",
        progress=progress,
        executor=executor,
    )


def released_files(result: runner.RunResult) -> dict[str, Any]:
    """What a release writes, as bytes (images, face crops, labels, which records, withheld)."""
    out = result.output
    return {
        "images": out.images.tobytes(),
        "faces": out.extra_images["face"].tobytes(),
        "labels": out.labels.tobytes(),
        "records": [c.tolist() for c in out.clusters or ()],
        "withheld": dict(out.withheld),
    }


def main(argv: list[str]) -> None:
    root, folder, run_id, workdir = (Path(a) for a in argv[:4])
    workers = int(argv[4]) if len(argv) > 4 else 0

    def progress(stage: str, done: int, total: int) -> None:
        print(f"{stage} {done}/{total}", flush=True)

    store = Store(Workspace(root))
    run_face_deid(store, photos(folder), str(run_id), workdir, ExecutorChoice(workers), progress)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
