"""Ledger: registration, reserve/commit/refund, idempotency, refusals that leave the store unchanged."""

import math

import numpy as np
import pytest

from accounting import ledger, trail
from accounting.epsilon import epsilon_rdp
from accounting.errors import (
    BudgetExceededError,
    DatasetConflictError,
    InvalidParameterError,
    LedgerStateError,
    UnknownDatasetError,
)
from accounting.events import DpSgd, GaussianQuery, NonPrivateRelease
from accounting.fingerprint import dataset_fingerprint, record_fingerprints


def register(store, name="mnist", fp="f" * 64, cap=3.0, delta=1e-5, n=5000):
    return ledger.register_dataset(
        store,
        name=name,
        source="builtin:mnist5k",
        fingerprint=fp,
        record_count=n,
        labels=list(range(10)),
        image_shape=[28, 28],
        epsilon_cap=cap,
        delta_cap=delta,
    )


def snapshot(store):
    return (
        store.query("SELECT * FROM datasets ORDER BY name"),
        store.query("SELECT * FROM charges ORDER BY position"),
        store.query("SELECT * FROM audit_trail ORDER BY seq"),
    )


def test_register_is_idempotent_and_refuses_changed_content(store):
    ds, created = register(store)
    again, created_again = register(store)
    assert created and not created_again and again == ds
    before = snapshot(store)
    with pytest.raises(DatasetConflictError, match="different content"):
        register(store, fp="0" * 64)
    assert snapshot(store) == before


def test_same_content_under_another_name_is_refused(store):
    register(store)
    with pytest.raises(DatasetConflictError, match="double its privacy budget"):
        register(store, name="mnist-copy")


@pytest.mark.parametrize(
    "cap,delta",
    [(math.nan, 1e-5), (-1, 1e-5), (math.inf, 1e-5), (1.0, 0.0), (1.0, 1.0), (1.0, 1e-3)],
)
def test_register_rejects_bad_caps(store, cap, delta):
    with pytest.raises((InvalidParameterError, DatasetConflictError)):
        register(store, cap=cap, delta=delta)
    assert store.query("SELECT * FROM datasets") == []


def test_unknown_dataset(store):
    with pytest.raises(UnknownDatasetError, match="Unknown dataset 'nope'"):
        ledger.budget(store, "nope")
    with pytest.raises(UnknownDatasetError):
        ledger.reserve(store, "nope", [GaussianQuery(10)], "r1")


def test_reserve_commit_refund_lifecycle(store):
    register(store, cap=5.0)
    plan = [GaussianQuery(20, 3**0.5), DpSgd(0.01, 1.0, 1000)]
    c = ledger.reserve(store, "mnist", plan, "run-1", description="privimage")
    assert c.state == "reserved"
    spent_reserved = ledger.budget(store, "mnist").spent_rdp
    assert spent_reserved == pytest.approx(epsilon_rdp(plan, 1e-5))
    # executed only 600 of 1000 steps: the remainder is released at commit
    c = ledger.commit(store, "run-1", [plan[0], DpSgd(0.01, 1.0, 600)])
    assert c.state == "committed"
    spent = ledger.budget(store, "mnist").spent_rdp
    assert spent == pytest.approx(epsilon_rdp([plan[0], DpSgd(0.01, 1.0, 600)], 1e-5))
    assert spent < spent_reserved
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "run-2")
    ledger.refund(store, "run-2", reason="failed before reading data")
    assert ledger.budget(store, "mnist").spent_rdp == pytest.approx(spent)


def test_replaying_a_run_id_never_double_charges(store):
    register(store)
    ev = [DpSgd(0.01, 1.0, 300)]
    ledger.reserve(store, "mnist", ev, "run-1")
    once = ledger.budget(store, "mnist").spent_rdp
    ledger.reserve(store, "mnist", ev, "run-1")
    ledger.commit(store, "run-1", ev)
    ledger.commit(store, "run-1", ev)
    assert ledger.budget(store, "mnist").spent_rdp == pytest.approx(once)
    with pytest.raises(LedgerStateError, match="different reservation"):
        ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 301)], "run-1")
    assert len(store.query("SELECT * FROM charges")) == 1


def test_budget_exceeded_changes_nothing(store):
    register(store, cap=1.0)
    before = snapshot(store)
    with pytest.raises(BudgetExceededError, match="over the cap 1"):
        ledger.reserve(store, "mnist", [DpSgd(0.05, 0.6, 2000)], "greedy")
    assert snapshot(store) == before


def test_prior_spend_counts_against_cap(store):
    register(store, cap=2.0)
    ev = DpSgd(0.01, 1.0, 380)  # filter epsilon ~1.98 alone (RDP epsilon ~1.53)
    ledger.reserve(store, "mnist", [ev], "a")
    with pytest.raises(BudgetExceededError):
        ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "b")


def test_commit_cannot_exceed_reservation(store):
    register(store)
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "r")
    with pytest.raises(LedgerStateError, match="more"):
        ledger.commit(store, "r", [DpSgd(0.01, 1.0, 5000)])
    assert ledger.get_charge(store, "r").state == "reserved"


def test_refund_after_commit_is_refused(store):
    register(store)
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "r")
    ledger.commit(store, "r", [DpSgd(0.01, 1.0, 100)])
    with pytest.raises(
        LedgerStateError,
        match="cannot be refunded: it read the data, so what it executed stays "
        "charged. Nothing was changed.",
    ):
        ledger.refund(store, "r", reason="oops")
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "s")
    ledger.refund(store, "s", reason="x")
    with pytest.raises(LedgerStateError, match="refunded"):
        ledger.commit(store, "s", [DpSgd(0.01, 1.0, 100)])


def test_non_private_release_needs_acknowledgement_and_voids_dp(store):
    register(store)
    with pytest.raises(
        LedgerStateError,
        match="Nothing was charged. To accept that, approve the release with "
        "`privrelease release approve REL --acknowledge-non-dp`",
    ):
        ledger.reserve(store, "mnist", [NonPrivateRelease("k-anonymous k=5")], "k")
    ledger.reserve(
        store, "mnist", [NonPrivateRelease("k-anonymous k=5")], "k", allow_non_private=True
    )
    b = ledger.budget(store, "mnist")
    assert b.dp_void and math.isinf(b.spent_rdp)
    with pytest.raises(BudgetExceededError):  # no further DP release can claim a finite epsilon
        ledger.reserve(store, "mnist", [GaussianQuery(100)], "after")


def test_reading_never_changes_the_ledger(store):
    register(store)
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "r")
    before = snapshot(store)
    for _ in range(3):
        ledger.budget(store, "mnist")
        ledger.list_datasets(store)
        ledger.all_charges(store)
        trail.verify(store)
    assert snapshot(store) == before


def test_every_write_is_in_the_audit_trail(store):
    register(store)
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "r")
    ledger.commit(store, "r", [DpSgd(0.01, 1.0, 50)])
    actions = [e["action"] for e in reversed(trail.entries(store))]
    assert actions == ["dataset.register", "budget.reserve", "budget.commit"]
    assert trail.verify(store).ok


def test_fingerprints_are_keyed():
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 255, (10, 8, 8), dtype=np.uint8), np.arange(10)
    a = dataset_fingerprint(b"k1" * 16, images, labels)
    assert a == dataset_fingerprint(b"k1" * 16, images.copy(), labels)
    assert a != dataset_fingerprint(b"k2" * 16, images, labels)  # no key, no test of membership
    neighbour = images.copy()
    neighbour[3, 0, 0] ^= 1
    assert a != dataset_fingerprint(b"k1" * 16, neighbour, labels)
    import hashlib

    plain = hashlib.sha256(images[0].tobytes()).hexdigest()
    assert plain not in record_fingerprints(b"k1" * 16, images)
