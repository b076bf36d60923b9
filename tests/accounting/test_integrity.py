"""The auditor's store check: the ledger replayed from the trail, signed checkpoints, crash vs. edit."""

import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import duckdb
import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accounting import integrity, ledger, trail
from accounting.errors import TamperError
from accounting.events import DpSgd, GaussianQuery
from accounting.store import Store, Workspace
from accounting.store_backends import PgConnection
from release import keys

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def filled(store):
    keys.create_identity(store, "alice", "steward")
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
    ledger.reserve(store, "d", [GaussianQuery(20.0)], "q1")
    ledger.commit(store, "q1", [GaussianQuery(20.0)])
    ledger.reserve(store, "d", [DpSgd(0.01, 1.0, 200)], "r1")
    ledger.commit(store, "r1", [DpSgd(0.01, 1.0, 200)])
    ledger.reserve(store, "d", [DpSgd(0.01, 1.0, 50)], "r2")
    ledger.refund(store, "r2", reason="test")
    assert integrity.verify_store(store).ok
    return store


def rechain(db_path: Path, head_path: Path, *sql: str) -> None:
    """An attacker with write access: edit, then recompute every (unkeyed) hash and rewrite trail.head."""
    url = Workspace(db_path.parent).store_url
    con = (
        PgConnection(psycopg.connect(url, autocommit=True)) if url else duckdb.connect(str(db_path))
    )
    try:
        for statement in sql:
            con.execute(statement)
        rows = con.execute(
            "SELECT seq, ts, actor, action, payload FROM audit_trail ORDER BY seq"
        ).fetchall()
        con.execute("DELETE FROM audit_trail")
        prev = trail.GENESIS
        for new_seq, (_, ts, actor, action, payload) in enumerate(rows, start=1):
            h = trail.entry_hash(new_seq, ts, actor, action, payload, prev)
            con.execute(
                "INSERT INTO audit_trail VALUES (?, ?, ?, ?, ?, ?, ?)",
                [new_seq, ts, actor, action, payload, prev, h],
            )
            prev = h
        head_path.write_text(f"{len(rows)} {prev}\n")
    finally:
        (con.raw if url else con).close()


def test_intact_store_recomputes_spend_from_trail(filled):
    r = integrity.verify_store(filled)
    assert r.ok and r.status == "intact"
    (row,) = r.spend
    assert row["agree"] and row["epsilon_rdp_trail"] == pytest.approx(
        ledger.budget(filled, "d").spent_rdp
    )
    assert row["epsilon_rdp_trail"] > 0


def test_charge_entries_commit_to_the_row(filled):
    payloads = [
        json.loads(e["payload"])
        for e in filled.query(
            "SELECT payload FROM audit_trail WHERE action LIKE 'budget.%' ORDER BY seq"
        )
    ]
    assert [p["state"] for p in payloads] == [
        "reserved",
        "committed",
        "reserved",
        "committed",
        "reserved",
        "refunded",
    ]
    assert all(
        {"run_id", "dataset_id", "position", "planned_events", "charged_events"} <= p.keys()
        for p in payloads
    )


def test_state_edit_in_charges_table_detected(filled, tamper):
    tamper(filled.workspace.db_path, "UPDATE charges SET state = 'refunded' WHERE run_id = 'r1'")
    assert ledger.get_charge(filled, "r1").state == "refunded"  # the lie `ledger show` would tell
    r = integrity.verify_store(filled)
    assert r.trail.ok and not r.ok and r.status == "altered"
    assert any("charge r1" in p and "state" in p for p in r.problems)
    assert (
        any("spend recomputed from the trail" in p for p in r.problems) and not r.spend[0]["agree"]
    )


def test_edited_events_and_inserted_charge_detected(filled, tamper):
    tamper(
        filled.workspace.db_path,
        "UPDATE charges SET charged_events = replace(charged_events, '200', '2') WHERE run_id = 'r1'",
        "INSERT INTO charges SELECT 99, 'ghost', dataset_id, 'refunded', planned_events, '[]', '', 'x', "
        "reserved_at, NULL FROM charges WHERE run_id = 'r2'",
    )
    problems = integrity.verify_store(filled).problems
    assert any("charge r1" in p and "charged_events" in p for p in problems)
    assert any("ghost" in p and "inserted" in p for p in problems)


def test_deleted_charges_and_their_entries_detected(filled, tamper):
    tamper(
        filled.workspace.db_path,
        "DELETE FROM charges",
        "DELETE FROM rdp_curves",
        "DELETE FROM audit_trail WHERE action LIKE 'budget.%'",
    )
    assert ledger.budget(filled, "d").spent_rdp == 0
    r = integrity.verify_store(filled)
    assert not r.ok and r.trail.problems  # the chain breaks where entries were cut out


def test_edited_running_curve_detected(filled, tamper):
    tamper(
        filled.workspace.db_path,
        "UPDATE rdp_curves SET rdp = replace(rdp, '.', '.0')",
        "UPDATE rdp_curves SET rdp = '[' || repeat('0.0, ', 155) || '0.0]'",
    )
    assert ledger.budget(filled, "d").spent_rdp == 0  # the lie budget show would tell
    r = integrity.verify_store(filled)
    assert not r.ok and any("running RDP curve" in p for p in r.problems)


def test_edited_dataset_cap_detected(filled, tamper):
    tamper(filled.workspace.db_path, "UPDATE datasets SET epsilon_cap = 1000")
    assert any("epsilon_cap" in p for p in integrity.verify_store(filled).problems)


def test_rechained_trail_detected_only_by_signed_checkpoint(filled):
    cp = integrity.make_checkpoint(
        filled, "alice", keys.load_private_key(filled.workspace, "alice")
    )
    assert Path(cp["path"]).stat().st_mode & 0o777 == 0o600
    outside = filled.workspace.root.parent / "pinned.json"
    outside.write_text(Path(cp["path"]).read_text())
    Path(cp["path"]).unlink()  # the attacker also removes the workspace's copy
    rechain(
        filled.workspace.db_path,
        filled.workspace.trail_head_path,
        "DELETE FROM charges WHERE run_id IN ('q1', 'r1')",
        "DELETE FROM rdp_curves",
        "DELETE FROM audit_trail WHERE action LIKE 'budget.%' AND payload LIKE '%\"q1\"%'",
        "DELETE FROM audit_trail WHERE action LIKE 'budget.%' AND payload LIKE '%\"r1\"%'",
    )
    assert ledger.budget(filled, "d").spent_rdp == 0
    assert integrity.verify_store(
        filled
    ).ok  # chain, head and ledger agree: only an outside anchor helps
    pub = keys.load_private_key(filled.workspace, "alice").public_key()
    r = integrity.verify_store(filled, [outside], trusted_keys=[keys.raw_public_bytes(pub)])
    assert not r.ok and any(
        "checkpoint of entry" in p and ("removed" in p or "rewritten" in p) for p in r.problems
    )


def test_forged_checkpoint_by_untrusted_key_refused(filled):
    mallory = Ed25519PrivateKey.generate()
    cp = integrity.make_checkpoint(filled, "alice", mallory)  # not alice's registered key
    r = integrity.verify_store(filled)
    assert not r.ok and any("not steward alice's registered key" in p for p in r.problems)
    alice = keys.raw_public_bytes(keys.load_private_key(filled.workspace, "alice").public_key())
    Path(cp["path"]).unlink()
    good = integrity.make_checkpoint(
        filled, "alice", keys.load_private_key(filled.workspace, "alice")
    )
    data = json.loads(Path(good["path"]).read_text())
    data["seq"] -= 1
    Path(good["path"]).write_text(json.dumps(data))
    r = integrity.verify_store(filled, trusted_keys=[alice])
    assert any("signature is not valid" in p for p in r.problems)


def test_checkpoint_of_altered_store_refused(filled, tamper):
    tamper(filled.workspace.db_path, "UPDATE charges SET state = 'refunded' WHERE run_id = 'r1'")
    with pytest.raises(TamperError, match="does not verify"):
        integrity.make_checkpoint(filled, "alice", keys.load_private_key(filled.workspace, "alice"))


# ------------------------------------------------------------------ crash between COMMIT and head record
def test_crash_between_commit_and_head_write_is_interrupted_not_altered(filled, monkeypatch):
    def crash(store):
        raise KeyboardInterrupt("killed after COMMIT")

    monkeypatch.setattr(trail, "_promote_pending", crash)
    with pytest.raises(KeyboardInterrupt):
        ledger.reserve(filled, "d", [GaussianQuery(30.0)], "r3")
    monkeypatch.undo()
    assert ledger.get_charge(filled, "r3").state == "reserved"  # committed
    v = trail.verify(filled)
    assert v.ok and v.status == "interrupted" and v.notes and not v.problems
    ledger.refund(filled, "r3", reason="after crash")  # the next write repairs the head record
    assert trail.verify(filled).status == "intact"
    assert not (filled.workspace.root / trail.PENDING_NAME).exists()


def test_rolled_back_transaction_leaves_head_intact(filled):
    with pytest.raises(RuntimeError):
        with filled.transaction() as con:
            trail.append(con, filled, "x", "test", {"a": 1})
            filled.before_commit.append(
                lambda: (_ for _ in ()).throw(RuntimeError("fail before COMMIT"))
            )
    assert trail.verify(filled).status == "intact"


@pytest.mark.parametrize("content", ["", "garbage", "12"])
def test_unreadable_head_file_is_altered_not_a_crash(filled, content):
    filled.workspace.trail_head_path.write_text(content)
    v = trail.verify(filled)
    assert not v.ok and v.status == "altered" and any("trail.head" in p for p in v.problems)


def test_edited_pending_head_does_not_hide_truncation(filled, tamper):
    n = trail.verify(filled).length
    tamper(filled.workspace.db_path, f"DELETE FROM audit_trail WHERE seq = {n}")
    last = filled.query(f"SELECT entry_hash FROM audit_trail WHERE seq = {n - 1}")[0]["entry_hash"]
    (filled.workspace.root / trail.PENDING_NAME).write_text(f"{n - 1} {last}\n")
    assert trail.verify(filled).status == "altered"


def _charge_forever(root: str, prefix: str, writing) -> None:
    """Reserve and refund in a loop until killed (a process of its own, forked: no imports to wait
    for, so the kills land among writes); `writing` is set after the first charge."""
    store, i = Store(root), 0
    while True:
        i += 1
        ledger.reserve(store, "d", [GaussianQuery(1000.0)], f"{prefix}-{i}")
        ledger.refund(store, f"{prefix}-{i}", reason="loop")
        writing.set()


def _charges_of(store, prefix: str) -> int:
    return len(store.query("SELECT run_id FROM charges WHERE run_id LIKE ?", [f"{prefix}-%"]))


def test_sigkill_loop_never_reports_altered(filled):
    rng = random.Random(13)
    statuses = []
    fork = multiprocessing.get_context("fork")
    for k in range(6):
        filled.backend.release()  # nothing of ours is open in the child
        writing = fork.Event()
        root = str(filled.workspace.root)
        p = fork.Process(target=_charge_forever, args=(root, f"k{k}", writing))
        p.start()
        assert writing.wait(60), "the child never charged"
        # then a random point among its writes (a reserve and refund take ~30 ms: 0.15 s spans
        # several of them)
        time.sleep(rng.random() * 0.15)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        r = integrity.verify_store(filled)
        assert r.ok, r.all_problems
        statuses.append(r.status)
    assert all(_charges_of(filled, f"k{k}") for k in range(6))  # each was killed while writing


@pytest.mark.slow
def test_publish_refuses_a_ledger_edited_behind_its_back(tmp_path: Path, tamper) -> None:
    """The chain alone stays intact when a charge row is edited; publishing replays the ledger from the
    trail and refuses (before: it checked only the chain and published over a lowered spend)."""
    from release import manager
    from tests.support.dashboard_workspace import approved_small_release, build_workspace

    built = build_workspace(tmp_path / "ws")
    rid = approved_small_release(built.store, built.root)
    manager.run_release(built.store, rid, "alice")
    tamper(
        built.store.workspace.db_path,
        "UPDATE charges SET state = 'refunded' WHERE run_id = 'run-sgd-1'",
    )
    assert trail.verify(built.store).ok  # the chain itself is intact: only the replay sees the edit
    with pytest.raises(TamperError, match="ledger was altered"):
        manager.publish(built.store, rid, "alice")
