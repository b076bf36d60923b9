"""Per-item throughput on Dask workers (issue 56, release/executor.py): the same photos (face-deid)
or synthetic heads (deface) released by a LocalCluster of 1 worker process and of 2, side by side in
one run, through the mechanism's registered `run` and the executor `release run --workers N` uses
(the ledger is left out: it adds two transactions a release, not a cost per item).

    python -m benchmarks.item_workers_bench [--mechanism face-deid|deface] [--items 12]
        [--preset default|tiny] [--mm 1.0]

Per run: the wall time from starting the cluster to stopping it, and the item phase alone (from the
first progress report of the items to the last, the models already loaded on every worker), whose
items per second give the speed-up. Prints a markdown row per run and the CPU load around them.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.common import machine, md_table, today
from benchmarks.faces_bench import as_dataset, single_face_photos
from release import executor as executors
from synth.mechanisms.deface_reface.config import DefaceConfig
from synth.mechanisms.deface_reface.run import run_deface
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.run import run as face_deid

STAGES = {"face-deid": "face-deid: photos", "deface": "deface (subjects)"}


class _Ctx(SimpleNamespace):
    """The runner's context less the ledger: items are mapped by `map_items` (an ItemMapper)."""

    def on_sensitive_access(self) -> None:
        pass

    def prepare_workers(self, setup, *args):
        return self.map_items.setup(setup, *args)


def release_on(workers: int, mechanism: str, data: Any, config: Any, cache: Path) -> dict:
    """`mechanism` on `data` on a LocalCluster of `workers` processes: wall and item-phase seconds,
    and the released images (to check they equal across runs)."""
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage == STAGES[mechanism]:
            if "first" not in marks:
                marks["first"] = time.perf_counter()
                cpu["first"] = _workers_cpu(items_on)
                cpu["coordinator_first"] = _cpu_seconds()
            if done == total:
                marks["last"] = time.perf_counter()
                cpu["last"] = _workers_cpu(items_on)
                cpu["coordinator_last"] = _cpu_seconds()

    start = time.perf_counter()
    items_on = executors.start(executors.ExecutorChoice(workers=workers))
    try:
        workdir = Path(tempfile.mkdtemp())
        ctx = _Ctx(
            workdir=workdir,
            progress=progress,
            public=None,
            plan=None,
            cache_dir=cache,
            nproc=1,
            map_items=executors.ItemMapper(items_on, progress, workdir),
        )
        run = face_deid if mechanism == "face-deid" else run_deface
        out = run(config, data, ctx)
    finally:
        items_on.close()
    wall = time.perf_counter() - start
    phase = marks["last"] - marks["first"]
    return {
        "workers": workers,
        "wall": wall,
        "phase": phase,
        "cpu": cpu["last"] - cpu["first"],
        "coordinator": cpu["coordinator_last"] - cpu["coordinator_first"],
        "images": out.images,
    }


def _cpu_seconds() -> float:
    """This process's CPU time (user + system), its children's included (the registration's)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _workers_cpu(items_on: Any) -> float:
    """CPU seconds used so far by every worker process."""
    return float(sum(items_on.client.run(_cpu_seconds).values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", choices=tuple(STAGES), default="face-deid")
    ap.add_argument("--items", type=int, default=12)
    ap.add_argument("--preset", choices=("default", "tiny"), default="default", help="face-deid")
    ap.add_argument("--mm", type=float, default=1.0, help="deface: the heads' voxel size")
    args = ap.parse_args(argv)
    cache = Path(tempfile.mkdtemp())
    data: Any
    if args.mechanism == "face-deid":
        config: Any = FaceDeidConfig.tiny() if args.preset == "tiny" else FaceDeidConfig()
        data = as_dataset(single_face_photos(args.items, seed=0), 192, Path(tempfile.mkdtemp()))
        what = f"{args.preset} preset, 192 px photos"
    else:
        from benchmarks.volumes_bench import _cohort
        from synth.tools.mri.atlas import atlases

        config, data = DefaceConfig(), _cohort(args.items, args.mm)
        atlases(cache)  # the atlas masks cached before the clock starts (public, once a workspace)
        what = f"default config, synthetic heads at {args.mm:g} mm"
    load_before = os.getloadavg()
    runs = [release_on(w, args.mechanism, data, config, cache) for w in (1, 2)]
    load_after = os.getloadavg()
    same = np.array_equal(runs[0]["images"], runs[1]["images"])
    rows = []
    for r in runs:
        rows.append(
            [
                args.mechanism,
                r["workers"],
                args.items,
                what,
                f"{r['wall']:.1f}",
                f"{r['phase']:.1f}",
                f"{r['phase'] / args.items:.2f}",
                f"{r['cpu'] / args.items:.2f}",
                f"{r['coordinator'] / args.items:.2f}",
                f"{r['cpu'] / (r['phase'] * r['workers']):.0%}",
                f"{runs[0]['phase'] / r['phase']:.2f}x",
            ]
        )
    print(
        f"Measured {today()} on {machine()}, {os.cpu_count()} cores. "
        f"`python -m benchmarks.item_workers_bench {' '.join(argv or sys.argv[1:])}`. "
        f"Load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f}, after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}. "
        f"Released images identical across the runs: {same}.\n"
    )
    print(
        md_table(
            [
                "mechanism",
                "workers",
                "items",
                "what",
                "wall s (cluster start to stop)",
                "item phase s",
                "item phase s / item",
                "worker CPU s / item",
                "coordinator CPU s / item",
                "CPU the workers got (of theirs)",
                "speed-up (item phase)",
            ],
            rows,
        )
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
