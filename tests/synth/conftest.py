"""Fixtures shared by the synth tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from accounting import ledger
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from synth.datasets import ImageDataset, load_source


def _register(root, name: str, source: str, data: ImageDataset) -> Store:
    """A new workspace at `root` with `data` registered as `name`, cap epsilon 8, delta 1e-5."""
    ws = Workspace(root)
    ws.init()
    st = Store(ws)
    ledger.register_dataset(
        st,
        name=name,
        source=source,
        fingerprint=dataset_fingerprint(ws.hmac_key(), data.images, data.labels),
        record_count=len(data),
        labels=data.label_set,
        image_shape=list(data.images.shape[1:]),
        epsilon_cap=8.0,
        delta_cap=1e-5,
    )
    return st


@pytest.fixture
def register_store(tmp_path) -> Callable[[str, str, ImageDataset], Store]:
    """register_store(name, source, data): a workspace with `data` registered, cap epsilon 8."""
    return lambda name, source, data: _register(tmp_path / "ws", name, source, data)


@pytest.fixture
def mnist200_store(register_store) -> tuple[Store, ImageDataset]:
    """A workspace with 200 MNIST-5k digits (20 a class) registered as "mnist", cap epsilon 8."""
    data = load_source("builtin:mnist5k")
    sensitive = data.subset(
        np.concatenate([np.flatnonzero(data.labels == c)[:20] for c in range(10)])
    )
    return register_store("mnist", "builtin:mnist5k", sensitive), sensitive
