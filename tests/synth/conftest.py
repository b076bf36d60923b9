"""Fixtures shared by the synth tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from accounting import ledger
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from release import runner
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import ImageDataset, load_source, uci_digits


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


@pytest.fixture
def halves_store(register_store) -> Callable[[int, int], tuple[Store, ImageDataset]]:
    """halves_store(n, size): n grey size x size images in two classes (class 0 bright on the left
    half, class 1 on the right) registered as "halves"."""

    def make(n: int, size: int) -> tuple[Store, ImageDataset]:
        rows = np.arange(n) % 2
        images = np.random.default_rng(0).integers(0, 60, (n, size, size)).astype(np.uint8)
        images[rows == 0, :, : size // 2] += 150
        images[rows == 1, :, size // 2 :] += 150
        data = ImageDataset(images, rows, source="halves")
        return register_store("halves", "halves", data), data

    return make


@pytest.fixture
def run_merf(tmp_path) -> Callable[..., tuple[registry.MechanismPlan, runner.RunResult]]:
    """run_merf(store, name, data, config, run_id[, plan=, progress=]): the merf release (planned on
    the dataset's history unless a plan is given) run through the runner (workdir tmp_path / "w");
    (plan, result)."""
    from synth.mechanisms.merf.run import MECHANISM

    def run(st: Store, name: str, data: ImageDataset, cfg, run_id: str, plan=None, **kw):
        if plan is None:
            b = ledger.budget(st, name)
            plan = MECHANISM.plan(cfg, dataset_info(b.dataset), b.history, uci_digits())
        res = runner.run_charged(
            st,
            run_id=run_id,
            dataset=name,
            data=data,
            public=uci_digits(),
            mechanism="merf",
            config=cfg,
            plan=plan,
            workdir=tmp_path / "w",
            actor="alice",
            **kw,
        )
        return plan, res

    return run
