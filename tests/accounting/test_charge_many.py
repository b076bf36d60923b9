"""ledger.charge_many: many charges in one transaction, written as reserve + commit of each would write them."""

from __future__ import annotations

import pytest

from accounting import curve, integrity, ledger, trail
from accounting.errors import BudgetExceededError, LedgerStateError
from accounting.events import DpSgd, GaussianQuery, NonPrivateRelease

HISTORY = [
    [DpSgd(0.01, 1.5, 100)],
    [GaussianQuery(200.0)],
    [DpSgd(0.02, 2.0, 50), GaussianQuery(300.0)],
]


def _register(store, name="mnist", cap=10.0):
    ledger.register_dataset(
        store,
        name=name,
        source="builtin:mnist5k",
        fingerprint="f" * 64 if name == "mnist" else "e" * 64,
        record_count=5000,
        labels=list(range(10)),
        image_shape=[28, 28],
        epsilon_cap=cap,
        delta_cap=1e-5,
    )


def test_charge_many_writes_what_reserve_and_commit_of_each_would(store):
    _register(store)
    ledger.reserve(
        store, "mnist", [DpSgd(0.01, 1.0, 10)], "first"
    )  # an open reservation stays counted
    charges = ledger.charge_many(store, "mnist", HISTORY, run_prefix="pre-", actor="bench")
    assert [c.run_id for c in charges] == ["pre-1", "pre-2", "pre-3"]
    assert [c.state for c in ledger.budget(store, "mnist").charges] == ["reserved"] + [
        "committed"
    ] * 3
    one_by_one = [DpSgd(0.01, 1.0, 10)] + [e for h in HISTORY for e in h]
    from accounting.epsilon import epsilon_rdp

    assert ledger.budget(store, "mnist").spent_rdp == pytest.approx(epsilon_rdp(one_by_one, 1e-5))
    actions = [r["action"] for r in reversed(trail.entries(store))]
    assert actions[-6:] == ["budget.reserve", "budget.commit"] * 3
    assert trail.verify(store).ok
    assert integrity.verify_store(store).ok  # the ledger replayed from the trail equals the table
    with store.transaction() as con:
        assert all(r["agree"] for r in curve.verify(con))
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 10)], "after")  # the store goes on as before
    assert trail.verify(store).ok and integrity.verify_store(store).ok


def test_charge_many_refuses_and_writes_nothing(store):
    _register(store, cap=1.0)
    before = (store.query("SELECT * FROM charges"), trail.entries(store))
    with pytest.raises(BudgetExceededError):
        ledger.charge_many(store, "mnist", [[DpSgd(0.01, 0.6, 1000)]] * 5, run_prefix="pre-")
    with pytest.raises(LedgerStateError, match="DP charges only"):
        ledger.charge_many(store, "mnist", [[NonPrivateRelease("k-anonymity")]], run_prefix="pre-")
    with pytest.raises(LedgerStateError):
        ledger.charge_many(store, "mnist", [[]], run_prefix="pre-")
    assert (store.query("SELECT * FROM charges"), trail.entries(store)) == before
    ledger.charge_many(store, "mnist", [[GaussianQuery(500.0)]], run_prefix="pre-")
    with pytest.raises(LedgerStateError, match="new prefix"):
        ledger.charge_many(store, "mnist", [[GaussianQuery(500.0)]], run_prefix="pre-")
