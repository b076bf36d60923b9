"""face-deid's throughput on Dask workers (issue 56, release/executor.py): the same photos released
by a LocalCluster of 1 worker process and of 2, side by side in one run, through face-deid's
registered `run` and the executor `release run --workers N` uses (the ledger is left out: it adds two
transactions a release, not a cost per photo).

    python -m benchmarks.item_workers_bench [--photos 12] [--preset default|tiny]

Per run: the wall time from starting the cluster to stopping it, and the photo phase alone (from the
first progress report of the photos to the last, the models already loaded on every worker), whose
photos per second give the speed-up. Prints a markdown row per run and the CPU load around them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.common import machine, md_table, today
from benchmarks.faces_bench import as_dataset, single_face_photos
from release import executor as executors
from synth.kinds.image_dataset import ImageDataset
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.run import run as face_deid

STAGE = "face-deid: photos"


class _Ctx(SimpleNamespace):
    """The runner's context less the ledger: where items run is `executor`."""

    def on_sensitive_access(self) -> None:
        pass

    def prepare_workers(self, setup, *args):
        return self.executor.setup(setup, *args)

    def map_items(self, fn, config, items, *, label):
        return executors.map_items(
            self.executor, self.workdir, fn, config, items, label=label, progress=self.progress
        )


def release_on(workers: int, data: ImageDataset, config: FaceDeidConfig) -> dict:
    """face-deid of `data` on a LocalCluster of `workers` processes: wall and photo-phase seconds,
    and the released images (to check they equal across runs)."""
    marks: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage == STAGE:
            marks.setdefault("first", time.perf_counter())
            if done == total:
                marks["last"] = time.perf_counter()

    start = time.perf_counter()
    items_on = executors.start(executors.ExecutorChoice(workers=workers))
    try:
        ctx = _Ctx(
            workdir=Path(tempfile.mkdtemp()),
            progress=progress,
            public=None,
            plan=None,
            cache_dir=None,
            nproc=1,
            executor=items_on,
        )
        out = face_deid(config, data, ctx)
    finally:
        items_on.close()
    wall = time.perf_counter() - start
    phase = marks["last"] - marks["first"]
    return {"workers": workers, "wall": wall, "phase": phase, "images": out.images}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--photos", type=int, default=12)
    ap.add_argument("--preset", choices=("default", "tiny"), default="default")
    args = ap.parse_args(argv)
    config = FaceDeidConfig.tiny() if args.preset == "tiny" else FaceDeidConfig()
    folder = Path(tempfile.mkdtemp())
    data = as_dataset(single_face_photos(args.photos, seed=0), 192, folder)
    load_before = os.getloadavg()
    runs = [release_on(1, data, config), release_on(2, data, config)]
    load_after = os.getloadavg()
    same = np.array_equal(runs[0]["images"], runs[1]["images"])
    rows = []
    for r in runs:
        rows.append(
            [
                r["workers"],
                args.photos,
                args.preset,
                f"{r['wall']:.1f}",
                f"{r['phase']:.1f}",
                f"{r['phase'] / args.photos:.2f}",
                f"{args.photos / r['phase']:.3f}",
                f"{runs[0]['phase'] / r['phase']:.2f}x",
            ]
        )
    print(
        f"Measured {today()} on {machine()}, {os.cpu_count()} cores. "
        f"`python -m benchmarks.item_workers_bench --photos {args.photos} --preset {args.preset}`. "
        f"Load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f}, after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}. "
        f"Released images identical across the runs: {same}.\n"
    )
    print(
        md_table(
            [
                "workers",
                "photos",
                "preset",
                "wall s (cluster start to stop)",
                "photo phase s",
                "s / photo",
                "photos / s",
                "speed-up",
            ],
            rows,
        )
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
