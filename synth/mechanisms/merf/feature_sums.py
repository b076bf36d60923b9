"""DP-MERF's query mapped over chunks of records: the entry's per-item function. Each chunk's exact
class sums are computed wherever the runner runs items (this process, or Dask workers with
`release run --workers N | --cluster ADDR`); the coordinator adds them up in chunk order and draws
the Gaussian noise once, on the total (`embedding.noised`), so the charge is the same one query
whatever the number of workers. The partial sums are as sensitive as the records: they travel only
between the coordinator and its workers and are never written to the run's work folder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.registry import RunContext
from synth.tools.kernel.embedding import FeatureMap, class_sums
from synth.tools.kernel.fit import ImageChunks, MerfSettings, feature_map

CHUNK = 2048  # records per item: one chunk of class_sums (about 1.6 MB of 28 x 28 images)


@dataclass(frozen=True)
class SumsJob:
    """What every chunk shares (public): the feature map's settings and the query's shape."""

    settings: MerfSettings
    n_pixels: int  # channels x size x size
    n_classes: int
    size: int  # the generator's square size the images are resized to


_MAPS: dict[SumsJob, FeatureMap] = {}  # one per process: the frequencies drawn once


def _feature_map(job: SumsJob) -> FeatureMap:
    if job not in _MAPS:
        _MAPS.clear()
        _MAPS[job] = feature_map(job.n_pixels, job.settings)
    return _MAPS[job]


def chunk_sums(job: SumsJob, item: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The per-item function (`MECHANISM.per_item`): one chunk's exact (n_classes, features + 1)
    class sums, images (uint8) with their class positions."""
    images, rows = item
    return class_sums(ImageChunks(images, job.size), rows, job.n_classes, _feature_map(job))


def exact_sums(
    ctx: RunContext,
    job: SumsJob,
    images: np.ndarray,
    rows: np.ndarray,
    fmap: FeatureMap | None = None,
) -> np.ndarray:
    """The query's un-noised matrix over all records, chunk by chunk through `ctx.map_items`,
    summed in chunk order (float64: the same total as one pass, to rounding). `fmap`: the job's
    feature map where the caller already has it, so chunks run in this process do not draw the
    frequencies a second time (workers elsewhere build their own from the job)."""
    if fmap is not None:
        _MAPS.clear()
        _MAPS[job] = fmap
    items = [(images[i : i + CHUNK], rows[i : i + CHUNK]) for i in range(0, len(images), CHUNK)]
    parts = ctx.map_items(chunk_sums, job, items, label="DP-MERF feature sums", keep=False)
    total = np.array(parts[0], dtype=np.float64, copy=True)
    for part in parts[1:]:
        total += part
    return total
