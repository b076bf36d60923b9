"""run_ksalsa against a real workspace: acknowledgement, charging, refunds, replay, audit trail."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from accounting import ledger, trail
from accounting.errors import (DataFormatError, InvalidParameterError, LedgerStateError, PrivReleaseError,
                               UnknownDatasetError)
from accounting.events import NonPrivateRelease
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from synth.datasets import ImageDataset, load_source, uci_digits
from synth.ksalsa import KSalsaConfig, plan_ksalsa, run_ksalsa, train_codec

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
    ws = Workspace(tmp_path / "ws")
    ws.init()
    st = Store(ws)
    ledger.register_dataset(st, name="mnist", source="builtin:mnist5k",
                            fingerprint=dataset_fingerprint(ws.hmac_key(), sensitive.images, sensitive.labels),
                            record_count=len(sensitive), labels=sensitive.label_set, image_shape=[28, 28],
                            epsilon_cap=8.0, delta_cap=1e-3)
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


def test_plan(sensitive):
    plan = plan_ksalsa(KSalsaConfig.tiny(4), len(sensitive))
    assert plan.events == [NonPrivateRelease("k-anonymous release, k=4")]
    assert plan.n_released == 7 and plan.n_dropped == 2
    assert "DP guarantees no longer hold" in plan.warnings[0]
    assert any("dropped" in w for w in plan.warnings)
    assert plan.guarantee["description"] == "k-anonymous (k=4)"
    with pytest.raises(InvalidParameterError):
        plan_ksalsa(KSalsaConfig.tiny(31), 30)


def test_refuses_without_acknowledgement(store, sensitive, public, tmp_path):
    with pytest.raises(LedgerStateError, match="acknowledge"):
        run_ksalsa(store, "mnist", sensitive, public, KSalsaConfig.tiny(3), run_id="r0", workdir=tmp_path / "w")
    assert ledger.get_charge(store, "r0") is None


def test_bad_inputs_are_refused_before_charging(store, sensitive, public, tmp_path):
    kw = dict(run_id="r0", workdir=tmp_path / "w", acknowledge_non_dp=True)
    with pytest.raises(UnknownDatasetError):
        run_ksalsa(store, "nope", sensitive, public, KSalsaConfig.tiny(3), **kw)
    with pytest.raises(InvalidParameterError):
        run_ksalsa(store, "mnist", sensitive, public, KSalsaConfig.tiny(31), **kw)
    with pytest.raises(DataFormatError):  # not the registered data
        run_ksalsa(store, "mnist", sensitive.subset(np.arange(10)), public, KSalsaConfig.tiny(3), **kw)
    odd = ImageDataset(np.zeros((30, 27, 27), np.uint8), sensitive.labels)
    with pytest.raises(InvalidParameterError, match="image_size"):
        run_ksalsa(store, "mnist", odd, public, KSalsaConfig.tiny(3), **kw)
    assert ledger.get_charge(store, "r0") is None


def test_full_run_commits_and_replays(store, sensitive, public, tmp_path):
    cfg = KSalsaConfig.tiny(4, "ksalsa")
    stages = []
    res = run_ksalsa(store, "mnist", sensitive, public, cfg, run_id="run-1", workdir=tmp_path / "w",
                     acknowledge_non_dp=True, actor="alice", progress=lambda s, d, t: stages.append(s))
    assert res.images.shape == (7, 28, 28) and res.images.dtype == np.uint8
    assert res.labels.shape == (7,) and res.label_distributions.shape == (7, 10)
    assert res.guarantee == {"type": "k-anonymity", "k": 4, "method": "ksalsa", "description": "k-anonymous (k=4)"}
    assert res.parameters["n_released"] == 7 and res.parameters["n_dropped"] == 2
    clusters = res.internal["clusters"]
    assert all(len(c) == 4 for c in clusters)
    flat = sorted(sum(clusters, []) + res.internal["remainder"])
    assert flat == list(range(30))
    for c, lab in zip(clusters, res.labels):  # majority label of the members
        assert lab == np.bincount(sensitive.labels[c], minlength=10).argmax()
    assert {"codec training", "clustering", "k-SALSA optimisation (clusters)"} <= set(stages)

    charge = ledger.get_charge(store, "run-1")
    assert charge.state == "committed" and charge.charged_events == res.executed_events
    assert ledger.budget(store, "mnist").dp_void
    entries = trail.entries(store)
    assert any(e["action"] == "ksalsa.release" for e in entries)
    assert trail.verify(store).ok

    # replay: results come back from disk, nothing is recomputed (the codec would fail) or charged again
    again = run_ksalsa(store, "mnist", sensitive, public, cfg, run_id="run-1", workdir=tmp_path / "w",
                       acknowledge_non_dp=True, codec=BrokenCodec())
    np.testing.assert_array_equal(again.images, res.images)
    assert again.internal == res.internal
    assert len(ledger.budget(store, "mnist").charges) == 1


def test_codec_failure_before_reading_is_refunded(store, sensitive, public, tmp_path):
    with pytest.raises(DataFormatError, match="codec"):
        run_ksalsa(store, "mnist", sensitive, public, KSalsaConfig.tiny(3, "centroid"), run_id="r-bad",
                   workdir=tmp_path / "w", acknowledge_non_dp=True, codec=BrokenCodec())
    assert ledger.get_charge(store, "r-bad").state == "refunded"
    assert not ledger.budget(store, "mnist").dp_void


def test_failure_after_reading_stays_charged(store, sensitive, public, tmp_path):
    codec = train_codec(public, tmp_path / "w", KSalsaConfig.tiny(3))
    with pytest.raises(RuntimeError, match="boom"):
        run_ksalsa(store, "mnist", sensitive, public, KSalsaConfig.tiny(3), run_id="r-mid", workdir=tmp_path / "w",
                   acknowledge_non_dp=True, codec=codec, net=FailingNet())
    assert ledger.get_charge(store, "r-mid").state == "committed"
    assert ledger.budget(store, "mnist").dp_void


@pytest.mark.parametrize("method", ["pixel", "pca", "centroid"])
def test_baseline_methods_run(store, sensitive, public, tmp_path, method):
    res = run_ksalsa(store, "mnist", sensitive, public, KSalsaConfig.tiny(5, method), run_id=f"r-{method}",
                     workdir=tmp_path / "w", acknowledge_non_dp=True)
    assert res.images.shape == (6, 28, 28) and res.internal["remainder"] == []
    assert res.parameters["method"] == method


def test_errors_are_privrelease_errors():
    assert issubclass(LedgerStateError, PrivReleaseError) and issubclass(DataFormatError, PrivReleaseError)


def test_reservation_of_an_earlier_attempt_is_not_refunded(store, sensitive, public, tmp_path):
    """An attempt that crashed after reading left its reservation: a retry failing early must not refund it."""
    cfg = KSalsaConfig.tiny(3, "centroid")
    ledger.reserve(store, "mnist", plan_ksalsa(cfg, len(sensitive)).events, "r-crash", allow_non_private=True)
    with pytest.raises(DataFormatError):
        run_ksalsa(store, "mnist", sensitive, public, cfg, run_id="r-crash", workdir=tmp_path / "w",
                   acknowledge_non_dp=True, codec=BrokenCodec())
    assert ledger.get_charge(store, "r-crash").state == "reserved"
