"""k-SALSA through the runner against a real workspace: acknowledgement, charging, refunds, one failure rule."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from accounting import ledger, trail
from accounting.errors import (
    DataFormatError,
    InvalidParameterError,
    LedgerStateError,
    PrivReleaseError,
    UnknownDatasetError,
)
from accounting.events import NonPrivateRelease
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from release import runner
from release.executor import ExecutorChoice
from release.planning import dataset_info
from release.retries import ItemFailedError
from synth.kinds.datasets import ImageDataset, load_source, uci_digits
from synth.mechanisms.ksalsa import KSalsaConfig, plan_ksalsa, train_codec
from synth.mechanisms.ksalsa.run import MECHANISM
from synth.mechanisms.ksalsa.run import run as ksalsa_run

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sensitive() -> ImageDataset:
    data = load_source("builtin:mnist5k")
    idx = np.concatenate([np.flatnonzero(data.labels == c)[:3] for c in range(10)])
    return data.subset(idx)  # 30 images


@pytest.fixture(scope="module")
def public() -> ImageDataset:
    return uci_digits().subset(np.arange(200))


@pytest.fixture
def store(tmp_path, sensitive) -> Store:
    return _store(tmp_path, sensitive)


def _store(tmp_path, sensitive) -> Store:
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
        delta_cap=1e-3,
    )
    return st


class BrokenCodec:
    """Decodes to the wrong size: must be caught on public data, before the sensitive set is read."""

    def encode(self, x):
        return x.flatten(1)[:, :8]

    def decode(self, z):
        return torch.zeros(len(z), 1, 14, 14)


class FailingNet:
    """A style/content net that fails mid-run, after the sensitive data was read."""

    def style_maps(self, x):
        raise RuntimeError("boom")

    def content(self, x):
        raise RuntimeError("boom")


def _plan(store, public, cfg, dataset="mnist"):
    b = ledger.budget(store, dataset)
    return MECHANISM.plan(cfg, dataset_info(b.dataset), b.history, public)


def _run(
    store,
    sensitive,
    public,
    cfg,
    run_id,
    tmp_path,
    *,
    ack=True,
    progress=None,
    executor=None,
    **inject,
):
    mech = (
        dataclasses.replace(MECHANISM, run=functools.partial(ksalsa_run, **inject))
        if inject
        else "ksalsa"
    )
    return runner.run_charged(
        store,
        run_id=run_id,
        dataset="mnist",
        data=sensitive,
        public=public,
        mechanism=mech,
        config=cfg,
        plan=_plan(store, public, cfg),
        workdir=tmp_path / "w",
        acknowledge_non_dp=ack,
        actor="alice",
        progress=progress or (lambda *a: None),
        executor=executor or ExecutorChoice(),
    )


def test_plan(sensitive):
    plan = plan_ksalsa(KSalsaConfig.tiny(4), len(sensitive))
    assert plan.events == (NonPrivateRelease("k-anonymous release, k=4"),)
    assert plan.n_released == 7 and plan.n_dropped == 2
    assert "DP guarantees no longer hold" in plan.warnings[0]
    assert any("dropped" in w for w in plan.warnings)
    with pytest.raises(InvalidParameterError):
        plan_ksalsa(KSalsaConfig.tiny(31), 30)


def test_refuses_without_acknowledgement(store, sensitive, public, tmp_path):
    with pytest.raises(PrivReleaseError, match="acknowledge"):
        _run(store, sensitive, public, KSalsaConfig.tiny(3), "r0", tmp_path, ack=False)
    assert ledger.get_charge(store, "r0") is None


def test_bad_inputs_are_refused_before_charging(store, sensitive, public, tmp_path):
    with pytest.raises(UnknownDatasetError):
        _plan(store, public, KSalsaConfig.tiny(3), dataset="nope")
    with pytest.raises(InvalidParameterError):
        _plan(store, public, KSalsaConfig.tiny(31))
    with pytest.raises(PrivReleaseError, match="registered"):  # not the registered data
        _run(store, sensitive.subset(np.arange(10)), public, KSalsaConfig.tiny(3), "r0", tmp_path)
    ds = ledger.get_dataset(store, "mnist")
    odd = dataset_info(ds).__class__(**{**dataset_info(ds).__dict__, "image_shape": (27, 27)})
    with pytest.raises(InvalidParameterError, match="image_size"):
        MECHANISM.plan(KSalsaConfig.tiny(3), odd, [], public)
    assert ledger.get_charge(store, "r0") is None


@pytest.mark.smoke
def test_full_run_commits(store, sensitive, public, tmp_path):
    cfg = KSalsaConfig.tiny(4, "ksalsa")
    stages = []
    res = _run(
        store, sensitive, public, cfg, "run-1", tmp_path, progress=lambda s, d, t: stages.append(s)
    )
    assert res.images.shape == (7, 28, 28) and res.images.dtype == np.uint8
    assert res.labels.shape == (7,) and res.output.label_distributions.shape == (7, 10)
    assert res.guarantee.as_dict() == {
        "type": "k-anonymity",
        "k": 4,
        "method": "ksalsa",
        "description": "k-anonymous (k=4)",
    }
    assert res.parameters["n_released"] == 7 and res.parameters["n_dropped"] == 2
    clusters = [c.tolist() for c in res.output.clusters]
    assert all(len(c) == 4 for c in clusters)
    assert sorted(sum(clusters, []) + res.internal["remainder"]) == list(range(30))
    for c, lab in zip(clusters, res.labels):  # majority label of the members
        assert lab == np.bincount(sensitive.labels[c], minlength=10).argmax()
    assert {"codec training", "clustering", "k-SALSA optimisation (cluster batches)"} <= set(stages)
    charge = ledger.get_charge(store, "run-1")
    assert charge.state == "committed" and tuple(charge.charged_events) == res.executed_events
    assert ledger.budget(store, "mnist").dp_void
    assert any(e["action"] == "run.sensitive_access" for e in trail.entries(store))
    assert trail.verify(store).ok
    with pytest.raises(
        LedgerStateError, match="already settled"
    ):  # never recomputed without a new charge
        _run(store, sensitive, public, cfg, "run-1", tmp_path)
    assert len(ledger.budget(store, "mnist").charges) == 1


def test_codec_failure_before_reading_is_refunded(store, sensitive, public, tmp_path):
    with pytest.raises(DataFormatError, match="codec"):
        _run(
            store,
            sensitive,
            public,
            KSalsaConfig.tiny(3, "centroid"),
            "r-bad",
            tmp_path,
            codec=BrokenCodec(),
        )
    assert ledger.get_charge(store, "r-bad").state == "refunded"
    assert not ledger.budget(store, "mnist").dp_void


def test_failure_after_reading_stays_charged_and_a_retry_failing_early_keeps_it(
    store, sensitive, public, tmp_path
):
    codec = train_codec(public, tmp_path / "w", KSalsaConfig.tiny(3))
    # a fault (not a data error, not transient) stops the run at its item, naming it and the cause
    with pytest.raises(ItemFailedError, match=r"item 1 of \d+ failed \(RuntimeError: boom\)"):
        _run(
            store,
            sensitive,
            public,
            KSalsaConfig.tiny(3),
            "r-mid",
            tmp_path,
            codec=codec,
            net=FailingNet(),
        )
    assert (
        ledger.get_charge(store, "r-mid").state == "reserved"
    )  # counted in full until resumed or abandoned
    assert ledger.budget(store, "mnist").dp_void
    # a retry that fails before reading must not refund what the earlier attempt's read made due
    with pytest.raises(DataFormatError):
        _run(store, sensitive, public, KSalsaConfig.tiny(3), "r-mid", tmp_path, codec=BrokenCodec())
    assert ledger.get_charge(store, "r-mid").state == "reserved"


@pytest.mark.parametrize("method", ["pixel", "pca", "centroid"])
def test_baseline_methods_run(store, sensitive, public, tmp_path, method):
    res = _run(store, sensitive, public, KSalsaConfig.tiny(5, method), f"r-{method}", tmp_path)
    assert res.images.shape == (6, 28, 28) and res.internal["remainder"] == []
    assert res.parameters["method"] == method


@pytest.mark.slow
def test_cluster_batches_on_two_dask_workers_release_the_same_bytes(sensitive, public, tmp_path):
    """k-SALSA's batches of clusters as per-item work (issue 56): two Dask worker processes
    release the same representatives, byte for byte, as this process; one charge each."""
    cfg = dataclasses.replace(KSalsaConfig.tiny(3, "ksalsa"), cluster_batch=3)  # 10 clusters: 4
    codec = train_codec(public, tmp_path / "codec", cfg)  # one public codec for both releases
    here = _run(
        _store(tmp_path / "a", sensitive),
        sensitive,
        public,
        cfg,
        "one",
        tmp_path / "a",
        codec=codec,
    )
    stages: list[tuple[str, int, int]] = []
    store = _store(tmp_path / "b", sensitive)
    there = _run(
        store,
        sensitive,
        public,
        cfg,
        "two",
        tmp_path / "b",
        progress=lambda s, d, t: stages.append((s, d, t)),
        executor=ExecutorChoice(workers=2),
        codec=codec,
    )
    assert here.images.tobytes() == there.images.tobytes()
    assert [c.tolist() for c in here.output.clusters] == [c.tolist() for c in there.output.clusters]
    assert [d for s, d, _ in stages if s == "k-SALSA optimisation (cluster batches)"] == [
        0,
        1,
        2,
        3,
        4,
    ]
    [charge] = ledger.budget(store, "mnist").charges
    assert charge.state == "committed"
