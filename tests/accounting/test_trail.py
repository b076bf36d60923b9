"""The audit trail detects an edited, deleted, reordered or truncated entry."""

import pytest

from accounting import ledger, trail
from accounting.events import DpSgd


@pytest.fixture
def filled(store):
    ledger.register_dataset(
        store,
        name="d",
        source="s",
        fingerprint="f",
        record_count=5000,
        labels=[0, 1],
        image_shape=[8, 8],
        epsilon_cap=10,
        delta_cap=1e-5,
    )
    for i in range(3):
        ledger.reserve(store, "d", [DpSgd(0.01, 1.0, 10 + i)], f"r{i}")
    assert trail.verify(store).ok and trail.verify(store).length == 4
    return store


def test_intact_chain_reports_head(filled):
    v = trail.verify(filled)
    assert v.ok and len(v.head_hash) == 64 and v.problems == []


def test_edited_entry_detected(filled, tamper):
    tamper(
        filled.workspace.db_path,
        "UPDATE audit_trail SET payload = replace(payload, '10', '99') WHERE seq = 2",
    )
    v = trail.verify(filled)
    assert not v.ok and 2 in v.broken_seqs and any("edited" in p for p in v.problems)


def test_edited_actor_detected(filled, tamper):
    tamper(filled.workspace.db_path, "UPDATE audit_trail SET actor = 'mallory' WHERE seq = 3")
    assert 3 in trail.verify(filled).broken_seqs


def test_deleted_entry_detected(filled, tamper):
    tamper(filled.workspace.db_path, "DELETE FROM audit_trail WHERE seq = 2")
    v = trail.verify(filled)
    assert not v.ok and any("deleted" in p for p in v.problems)


def test_rows_stored_out_of_order_are_a_rewrite_on_duckdb_only(filled, tamper, store_backend):
    """The chain's order is seq. DuckDB appends one process at a time at the end, so rows stored out
    of that order mean the table was rewritten; on PostgreSQL storage order means nothing (other
    hosts' pages, VACUUM), and the chain read by seq is intact."""
    tamper(
        filled.workspace.db_path,
        "CREATE TEMP TABLE t AS SELECT * FROM audit_trail",
        "DELETE FROM audit_trail",
        "INSERT INTO audit_trail SELECT * FROM t ORDER BY CASE seq WHEN 2 THEN 3 WHEN 3 THEN 2 ELSE seq END",
    )
    v = trail.verify(filled)
    if store_backend == "duckdb":
        assert not v.ok and 2 in v.broken_seqs
        assert any("reordered" in p for p in v.problems), v.problems
    else:
        assert v.ok and v.status == "intact", v.problems
        assert [r[0] for r in trail.read_rows(filled)] == [1, 2, 3, 4]


def test_swapped_sequence_numbers_detected(filled, tamper, store_backend):
    if (
        store_backend == "postgresql"
    ):  # PostgreSQL checks the primary key row by row: swap through negatives
        tamper(
            filled.workspace.db_path,
            "UPDATE audit_trail SET seq = -seq WHERE seq IN (2, 3)",
            "UPDATE audit_trail SET seq = CASE seq WHEN -2 THEN 3 ELSE 2 END WHERE seq < 0",
        )
    else:
        tamper(
            filled.workspace.db_path,
            "UPDATE audit_trail SET seq = CASE seq WHEN 2 THEN 3 WHEN 3 THEN 2 ELSE seq END",
        )
    assert not trail.verify(filled).ok


def test_truncated_tail_detected_by_recorded_head(filled, tamper):
    tamper(filled.workspace.db_path, "DELETE FROM audit_trail WHERE seq = 4")
    v = trail.verify(filled)
    assert not v.ok and any("recorded head" in p for p in v.problems)


def test_failed_transaction_leaves_no_entry(filled):
    with pytest.raises(RuntimeError):
        with filled.transaction() as con:
            trail.append(con, filled, "x", "test", {"a": 1})
            raise RuntimeError("boom")
    v = trail.verify(filled)
    assert v.ok and v.length == 4
    ledger.reserve(filled, "d", [DpSgd(0.01, 1.0, 20)], "after-crash")  # takes the dead entry's seq
    v = trail.verify(filled)
    assert v.ok and v.length == 5 and v.status == "intact", v.problems
