"""Fixtures shared by the synth tests."""

from __future__ import annotations

import numpy as np
import pytest

from accounting import ledger
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from synth.datasets import ImageDataset, load_source


@pytest.fixture
def mnist200_store(tmp_path) -> tuple[Store, ImageDataset]:
    """A workspace with 200 MNIST-5k digits (20 a class) registered as "mnist", cap epsilon 8."""
    data = load_source("builtin:mnist5k")
    sensitive = data.subset(
        np.concatenate([np.flatnonzero(data.labels == c)[:20] for c in range(10)])
    )
    ws = Workspace(tmp_path / "ws")
    ws.init()
    st = Store(ws)
    ledger.register_dataset(
        st,
        name="mnist",
        source="builtin:mnist5k",
        fingerprint=dataset_fingerprint(ws.hmac_key(), sensitive.images, sensitive.labels),
        record_count=len(sensitive),
        labels=sensitive.label_set,
        image_shape=[28, 28],
        epsilon_cap=8.0,
        delta_cap=1e-5,
    )
    return st, sensitive
