"""The store's backends: DuckDB held across transactions, PostgreSQL shared by several workspaces (hosts),
and `privrelease store migrate` from one to the other. Needs a PostgreSQL server (see conftest.pg_server)."""

import multiprocessing
import shutil
import subprocess
import sys
import time

import psycopg
import pytest
from typer.testing import CliRunner

from accounting import integrity, ledger, trail
from accounting.errors import BudgetExceededError, PrivReleaseError
from accounting.events import DpSgd, GaussianQuery
from accounting.store import Store, Workspace
from accounting.store_backends import HOLD_IDLE_S, to_postgres
from release import keys
from release.cli import app

EVENT = DpSgd(0.01, 1.0, 100)


def _register(store, cap: float = 10.0) -> None:
    ledger.register_dataset(
        store,
        name="d",
        source="s",
        fingerprint="f",
        record_count=5000,
        labels=[0],
        image_shape=[8, 8],
        epsilon_cap=cap,
        delta_cap=1e-5,
    )


def _cli(ws: Workspace, *args: str):
    return CliRunner().invoke(app, ["--workspace", str(ws.root), *args])


# ------------------------------------------------------------------ dialect
def test_duckdb_dialect_is_translated_for_postgres():
    sql = "SELECT * FROM t WHERE a = ? AND b LIKE '50%?' AND c = ? ORDER BY rowid"
    assert (
        to_postgres(sql, True)
        == "SELECT * FROM t WHERE a = %s AND b LIKE '50%?' AND c = %s ORDER BY ctid"
    )
    assert to_postgres("SELECT 'a%' WHERE x = ?", True) == "SELECT 'a%' WHERE x = %s"
    assert (
        to_postgres("SELECT 5 % 2", True) == "SELECT 5 %% 2"
        and to_postgres("SELECT 5 % 2", False) == "SELECT 5 % 2"
    )
    assert (
        to_postgres("CREATE TABLE x (a DOUBLE NOT NULL, b DOUBLE PRECISION)", False)
        == "CREATE TABLE x (a DOUBLE PRECISION NOT NULL, b DOUBLE PRECISION)"
    )


# ------------------------------------------------------------------ DuckDB: one connection per burst
def test_duckdb_connection_is_kept_across_transactions_and_let_go_when_idle(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    with store.transaction() as a:
        pass
    with store.transaction() as b:
        pass
    assert a is b  # no connect + checkpoint per transaction (it cost 43-64 ms each)
    time.sleep(HOLD_IDLE_S * 6)
    probe = "import duckdb, sys; duckdb.connect(sys.argv[1]).execute('SELECT count(*) FROM meta').fetchone()"
    r = subprocess.run(
        [sys.executable, "-c", probe, str(ws.db_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, (
        r.stderr
    )  # idle: the file is free for any other process, even without our lock


def test_a_workspace_removed_and_made_again_gets_a_fresh_store(tmp_path):
    for _ in range(2):  # the kept connection must not go on writing into the removed file
        ws = Workspace(tmp_path / "ws")
        ws.init()
        store = Store(ws)
        _register(store)
        assert [d.name for d in ledger.list_datasets(store)] == ["d"] and trail.verify(store).ok
        shutil.rmtree(
            ws.root, ignore_errors=True
        )  # the idle timer may remove store.duckdb.wal meanwhile
        assert not ws.root.exists()


def _charge_once_when_busy(root: str, busy, waited) -> None:
    """The other process (forked: no second interpreter importing the packages for seconds): it asks
    for the store once the busy one charges, and says how long it waited."""
    s = Store(root)
    busy.wait(60)
    t = time.time()
    ledger.reserve(s, "d", [GaussianQuery(100.0)], "other")
    waited.value = time.time() - t


def test_a_waiting_process_gets_the_store_while_this_one_keeps_charging(tmp_path):
    """A process that waits for the store gets it at the end of the busy one's transaction: the
    busy one lets a waiter go first (store_backends.HANDOFF_S) instead of re-taking the free lock
    before the waiter's next poll (it waited 0.3-17 s then, 0.12 s now on the 2-core VM)."""
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    _register(store, cap=1000)
    fork = multiprocessing.get_context("fork")
    busy, waited = fork.Event(), fork.Value("d", -1.0)
    store.backend.release()  # nothing of ours is open in the child
    p = fork.Process(target=_charge_once_when_busy, args=(str(ws.root), busy, waited))
    p.start()
    deadline, i = time.time() + 60, 0
    while p.is_alive() and time.time() < deadline:  # back-to-back transactions, never idle for long
        i += 1
        ledger.reserve(store, "d", [GaussianQuery(100.0)], f"busy-{i}")
        busy.set()
    p.join(10)
    assert p.exitcode == 0 and ledger.get_charge(store, "other") is not None
    assert 0.0 <= waited.value < 5.0  # seconds it waited
    assert trail.verify(store).ok


# ------------------------------------------------------------------ PostgreSQL workspaces
def test_init_with_store_url_keeps_the_ledger_in_postgres(tmp_path, pg_server):
    url = pg_server.new_database()
    ws = Workspace(tmp_path / "ws")
    r = _cli(ws, "init", "--store", url, "--steward", "alice")
    assert r.exit_code == 0, r.output
    assert not ws.db_path.exists() and ws.config_path.stat().st_mode & 0o777 == 0o600
    store = Store(ws)
    assert store.shared and ws.store_url == url
    with psycopg.connect(url) as con:
        assert con.execute("SELECT name, role FROM identities").fetchall() == [("alice", "steward")]
    r = _cli(ws, "store", "info", "--json")
    assert '"backend": "postgresql"' in r.output


def test_init_refuses_a_url_that_is_not_postgres_and_an_unreachable_server(tmp_path):
    with pytest.raises(PrivReleaseError, match="PostgreSQL URL"):
        Workspace(tmp_path / "a").init(store_url="mysql://x@localhost/db")
    with pytest.raises(
        PrivReleaseError,
        match="Cannot reach the PostgreSQL store postgresql://u:\\*\\*\\*@127.0.0.1:1/x",
    ):
        Workspace(tmp_path / "b").init(store_url="postgresql://u:secret@127.0.0.1:1/x")
    assert not Workspace(
        tmp_path / "b"
    ).initialised  # nothing half-made that later commands would trust


def _two_hosts(tmp_path, pg_server) -> tuple[Store, Store]:
    url = pg_server.new_database()
    a, b = Workspace(tmp_path / "host-a"), Workspace(tmp_path / "host-b")
    a.init(store_url=url)
    b.keys.mkdir(parents=True, mode=0o700)
    shutil.copy2(a.hmac_key_path, b.hmac_key_path)  # hosts share the fingerprint key (README)
    b.init(store_url=url)
    return Store(a), Store(b)


def test_two_hosts_share_one_ledger_and_cap(tmp_path, pg_server):
    a, b = _two_hosts(tmp_path, pg_server)
    _register(a, cap=2.0)
    admitted = 0
    for i in range(10):
        host = a if i % 2 else b
        try:
            ledger.reserve(host, "d", [EVENT], f"run-{i}")
            ledger.commit(host, f"run-{i}", [EVENT])
            admitted += 1
        except BudgetExceededError:
            break
    assert 0 < admitted < 10
    assert ledger.budget(a, "d").spent_rdp == ledger.budget(b, "d").spent_rdp <= 2.0
    for host in (a, b):  # each host's recorded head is an entry of the one linear chain
        r = integrity.verify_store(host)
        assert r.ok and r.status == "intact", r.all_problems


def _charge(host: Store, i: int) -> None:
    """One honest charge (reserve + commit) and a small entry after it (a sign-in's size): a trail's
    entries are of mixed sizes, which is what lets PostgreSQL put a later one in an earlier page."""
    ledger.reserve(host, "d", [DpSgd(0.01, 1.0, 100 + i)], f"run-{i}")
    ledger.commit(host, f"run-{i}", [DpSgd(0.01, 1.0, 100 + i)])
    with host.transaction() as con:
        trail.append(con, host, "alice", "auth.sign_in", {"name": "alice", "result": "ok"})


def _vacuum(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("VACUUM audit_trail")


def _assert_stored_out_of_order_and_intact(url: str, *hosts: Store) -> None:
    """The server stored the rows out of write order (else this scenario tests nothing), and every
    host still reads one intact chain: its order is seq, not where the rows sit (ctid)."""
    with psycopg.connect(url) as con:
        stored = [r[0] for r in con.execute("SELECT seq FROM audit_trail ORDER BY ctid")]
    assert stored != sorted(stored), "the server kept write order: the scenario needs changing"
    for host in hosts:
        report = integrity.verify_store(host)
        assert report.ok and report.status == "intact", report.all_problems[:3]
        assert [r[0] for r in trail.read_rows(host)] == list(range(1, len(stored) + 1))


def test_two_hosts_alternating_read_one_chain_in_write_order(tmp_path, pg_server):
    """Issue 42: each backend inserts into its own target page, so two hosts' entries interleave on
    disk; read by ctid the chain broke after 6 charges and publishing was refused."""
    a, b = _two_hosts(tmp_path, pg_server)
    _register(a, cap=1000)
    for i in range(30):
        _charge((a, b)[i % 2], i)
    _assert_stored_out_of_order_and_intact(a.workspace.store_url or "", a, b)


def test_vacuum_and_fresh_connections_do_not_break_the_chain(tmp_path, pg_server):
    """After VACUUM a new connection (every CLI command is one) fills free space in earlier pages."""
    ws = Workspace(tmp_path / "ws")
    url = pg_server.new_database()
    ws.init(store_url=url)
    store = Store(ws)
    _register(store, cap=1000)
    for i in range(30):
        _charge(store, i)
        if i % 5 == 4:
            _vacuum(url)
            store.backend.release()  # the next transaction connects afresh
    _assert_stored_out_of_order_and_intact(url, store)


def test_a_rolled_back_transaction_and_vacuum_do_not_break_the_chain(tmp_path, pg_server):
    """A transaction that dies after writing its trail row (a crashed publish): VACUUM frees the dead
    row's space, and a later entry is stored there. The dead entry's seq is given again: it never
    committed, so the chain has no gap."""
    ws = Workspace(tmp_path / "ws")
    url = pg_server.new_database()
    ws.init(store_url=url)
    store = Store(ws)
    _register(store, cap=1000)
    for i in range(30):
        if i == 10:
            with pytest.raises(RuntimeError), store.transaction() as con:
                trail.append(con, store, "alice", "release.publish", {"path": "/srv/" + "b" * 1500})
                raise RuntimeError("the process died before COMMIT")
        if i == 13:
            _vacuum(url)
        _charge(store, i)
        store.backend.release()
    _assert_stored_out_of_order_and_intact(url, store)


def test_a_host_detects_removal_of_what_it_wrote(tmp_path, pg_server, tamper):
    a, b = _two_hosts(tmp_path, pg_server)
    _register(a)
    ledger.reserve(b, "d", [EVENT], "from-b")
    n = trail.verify(b).length
    tamper(b.workspace.db_path, f"DELETE FROM audit_trail WHERE seq = {n}")
    assert not trail.verify(b).ok  # b pinned entry n
    assert trail.verify(
        a
    ).ok  # a never saw it: only the writing host (or a signed checkpoint) can tell


def test_a_host_with_another_fingerprint_key_is_refused(tmp_path, pg_server):
    url = pg_server.new_database()
    Workspace(tmp_path / "a").init(store_url=url)
    b = Workspace(tmp_path / "b")
    with pytest.raises(PrivReleaseError, match="another fingerprint key"):
        b.init(store_url=url)
    assert b.store_url is None and not b.initialised


def test_postgres_transactions_roll_back_on_error(tmp_path, pg_server):
    ws = Workspace(tmp_path / "ws")
    ws.init(store_url=pg_server.new_database())
    store = Store(ws)
    with pytest.raises(RuntimeError):
        with store.transaction() as con:
            con.execute("INSERT INTO meta VALUES ('x', ?)", ["1"])
            raise RuntimeError("boom")
    assert store.query("SELECT * FROM meta WHERE key = ?", ["x"]) == []


# ------------------------------------------------------------------ migrate
def _duckdb_workspace(tmp_path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    keys.create_identity(store, "alice", "steward")
    _register(store)
    ledger.reserve(store, "d", [GaussianQuery(20.0)], "q1")
    ledger.commit(store, "q1", [GaussianQuery(20.0)])
    ledger.reserve(store, "d", [EVENT], "r1")
    ledger.refund(store, "r1", reason="test")
    integrity.make_checkpoint(store, "alice", keys.load_private_key(ws, "alice"))
    return ws


def test_migrate_copies_verifies_and_switches(tmp_path, pg_server):
    ws = _duckdb_workspace(tmp_path)
    before = ledger.budget(Store(ws), "d")
    rows_before = trail.read_rows(Store(ws))
    url = pg_server.new_database()
    r = _cli(ws, "store", "migrate", "--to", url, "--as", "alice")
    assert r.exit_code == 0, r.output
    assert ws.store_url == url and "Verified" in r.output
    store = Store(ws)
    after = ledger.budget(store, "d")
    assert after.spent_rdp == before.spent_rdp
    assert [c.run_id for c in after.charges] == [c.run_id for c in before.charges]
    rows = trail.read_rows(store)
    assert rows[: len(rows_before)] == rows_before and rows[-1][3] == "store.migrate"
    rep = integrity.verify_store(store)
    assert rep.ok and rep.checkpoints and all(c["ok"] for c in rep.checkpoints)
    ledger.reserve(store, "d", [EVENT], "after")  # the ledger goes on in PostgreSQL
    assert integrity.verify_store(store).ok


def test_migrate_refuses_a_non_empty_target(tmp_path, pg_server):
    url = pg_server.new_database()
    Workspace(tmp_path / "other").init(store_url=url)
    Store(Workspace(tmp_path / "other")).query("SELECT 1")
    ws = _duckdb_workspace(tmp_path)
    r = _cli(ws, "store", "migrate", "--to", url, "--as", "alice")
    assert r.exit_code != 0
    assert isinstance(r.exception, PrivReleaseError) and "is not empty" in str(r.exception)
    assert (
        ws.store_url is None and integrity.verify_store(Store(ws)).ok
    )  # still on DuckDB, untouched


def test_migrate_refuses_an_altered_store(tmp_path, pg_server, tamper):
    ws = _duckdb_workspace(tmp_path)
    tamper(ws.db_path, "UPDATE charges SET state = 'refunded' WHERE run_id = 'q1'")
    r = _cli(ws, "store", "migrate", "--to", pg_server.new_database(), "--as", "alice")
    assert r.exit_code != 0 and "does not verify" in str(r.exception)
    assert ws.store_url is None
