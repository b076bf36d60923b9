"""DP-MERF's query mapped over chunks of records (issue 56): summed chunk by chunk on two Dask worker
processes, the exact matrix equals this process's to float64 rounding (the same chunks, each on one
thread), and both equal one pass over all records to the features' float32 rounding; a release on
two workers is charged its one query, once, and writes none of the un-noised partial sums to its
work folder (real Dask on localhost: slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from accounting import ledger
from release import executor as executors
from release.executor import ITEMS_DIR, ExecutorChoice
from synth.mechanisms.merf import MerfConfig
from synth.mechanisms.merf import feature_sums as fs
from synth.tools.kernel.embedding import class_sums
from synth.tools.kernel.fit import ImageChunks, MerfSettings, generator_size


class _Items:
    """The part of the runner's context a mechanism maps items with, on a real executor."""

    def __init__(self, executor, workdir: Path) -> None:
        self.stages: list[tuple[str, int, int]] = []
        self.map_items = executors.ItemMapper(
            executor, lambda s, d, t: self.stages.append((s, d, t)), workdir
        )


def _job(images: np.ndarray, perceptual: float) -> fs.SumsJob:
    size = generator_size(*images.shape[1:3])
    settings = MerfSettings(200, 105.0, 8, 8, 1, 8, 1e-3, 3, perceptual)
    return fs.SumsJob(settings, size * size, 10, size)


def _one_pass(job: fs.SumsJob, images: np.ndarray, rows: np.ndarray) -> np.ndarray:
    fmap = fs.feature_map(job.n_pixels, job.settings)
    return class_sums(ImageChunks(images, job.size), rows, job.n_classes, fmap)


@pytest.mark.parametrize("perceptual", [0.0, 0.3])
def test_the_query_summed_chunk_by_chunk_equals_one_pass(
    mnist200_store, monkeypatch, tmp_path, perceptual
) -> None:
    _, data = mnist200_store
    monkeypatch.setattr(fs, "CHUNK", 64)  # 200 records: four chunks
    rows = data.labels.astype(np.int64)
    job = _job(data.images, perceptual)
    ctx = _Items(executors.InProcess(), tmp_path)
    total = fs.exact_sums(ctx, job, data.images, rows)
    # features are float32 (summed in float64): another chunking rounds them differently
    np.testing.assert_allclose(total, _one_pass(job, data.images, rows), rtol=0, atol=1e-6)
    assert [d for s, d, _ in ctx.stages] == [0, 1, 2, 3, 4]
    assert not (tmp_path / ITEMS_DIR).exists()  # un-noised sums are never written


@pytest.mark.slow
def test_merf_on_two_dask_workers_sums_as_one_process_and_is_charged_once(
    mnist200_store, run_merf, monkeypatch, tmp_path
) -> None:
    st, data = mnist200_store
    monkeypatch.setattr(fs, "CHUNK", 64)
    rows = data.labels.astype(np.int64)
    job = _job(data.images, 0.0)
    dask = executors.start(ExecutorChoice(workers=2))
    try:
        total = fs.exact_sums(_Items(dask, tmp_path / "sums"), job, data.images, rows)
    finally:
        dask.close()
    here = fs.exact_sums(_Items(executors.InProcess(), tmp_path / "one"), job, data.images, rows)
    np.testing.assert_allclose(total, here, rtol=0, atol=1e-9)

    stages: list[tuple[str, int, int]] = []
    plan, res = run_merf(
        st,
        "mnist",
        data,
        MerfConfig.tiny(2.0, 1e-5, n_samples=30),
        "w2",
        executor=ExecutorChoice(workers=2),
        progress=lambda s, d, t: stages.append((s, d, t)),
    )
    assert res.images.shape == (30, 28, 28)
    [charge] = [c for c in ledger.budget(st, "mnist").charges if c.run_id.startswith("w2")]
    assert charge.state == "committed" and tuple(charge.charged_events) == plan.events
    assert [d for s, d, _ in stages if s == "DP-MERF feature sums"] == [0, 1, 2, 3, 4]
    assert not (tmp_path / "w" / ITEMS_DIR).exists()
