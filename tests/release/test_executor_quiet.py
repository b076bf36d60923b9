"""What a steward reads while items run on Dask workers is ours: a large item (a photograph of
tens of MB travels with its task) does not print distributed's "Sending large graph" advice."""

from __future__ import annotations

import warnings

import numpy as np

from release.executor import DaskExecutor, ExecutorChoice


def total(config: int, item: np.ndarray) -> int:
    return int(item[::1024].sum()) + config


def test_a_large_item_is_sent_to_a_worker_without_a_library_warning() -> None:
    big = np.ones(24 * 1024 * 1024, dtype=np.uint8)  # 24 MiB: over distributed's 10 MB advice
    executor = DaskExecutor(ExecutorChoice(workers=1))
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = list(executor.map(total, 1, [(0, big)]))
    finally:
        executor.close()
    assert out == [(0, int(big[::1024].sum()) + 1)]
    assert not [w for w in seen if "large graph" in str(w.message)], [str(w.message) for w in seen]
