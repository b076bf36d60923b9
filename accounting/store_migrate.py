"""Move a workspace's store from its DuckDB file into a PostgreSQL database (`privrelease store
migrate`).

Every table is copied inside one PostgreSQL transaction, while the DuckDB store is locked (the
source must verify first, its storage order included); the workspace is switched to the new store
only when the copy verifies: chain (read by `seq`), recorded head, ledger replayed from the trail,
and the same head entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting import integrity
from accounting.errors import PrivReleaseError, TamperError
from accounting.store import Store, Workspace, check_fingerprint_key, check_store_url
from accounting.store_backends import PgConnection, PostgresBackend, redact, to_postgres


@dataclass(frozen=True)
class Migration:
    url: str
    rows: dict[str, int]  # table -> rows copied
    head: tuple[int, str]


def _source_tables(src: Store) -> list[tuple[str, str]]:
    with src.transaction() as con:
        return con.execute(
            "SELECT table_name, sql FROM duckdb_tables() "
            "WHERE schema_name = 'main' ORDER BY table_name"
        ).fetchall()


def _refuse_non_empty(con: PgConnection, url: str) -> None:
    tables = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    ]
    filled = [t for t in tables if con.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone()]
    if filled:
        raise PrivReleaseError(
            f"The target database {redact(url)} is not empty (tables with rows: "
            f"{', '.join(sorted(filled))}). Migrate into a new, empty database (e.g. `createdb "
            "privrelease`); nothing was copied."
        )


def _copy_table(src_con, dst: PgConnection, table: str, ddl: str) -> int:
    dst.execute(to_postgres(ddl.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1), False))
    # DuckDB's storage order; the trail's order is its seq column, whatever order PostgreSQL stores
    cur = src_con.execute(f'SELECT * FROM "{table}" ORDER BY rowid')
    columns = ", ".join(f'"{d[0]}"' for d in cur.description)
    n = 0
    with dst.raw.cursor().copy(f'COPY "{table}" ({columns}) FROM STDIN') as copy:
        while batch := cur.fetchmany(1000):
            for row in batch:
                copy.write_row(row)
            n += len(batch)
    return n


def _head(store: Store) -> tuple[int, str] | None:
    with store.transaction() as con:
        row = con.execute(
            "SELECT seq, entry_hash FROM audit_trail WHERE seq = (SELECT max(seq) FROM audit_trail)"
        ).fetchone()
    return (int(row[0]), row[1]) if row else None


def migrate_to_postgres(ws: Workspace, url: str) -> Migration:
    """Copy the workspace's DuckDB store into the empty PostgreSQL database at `url`, verify,
    switch."""
    check_store_url(url)
    if ws.store_url is not None:
        raise PrivReleaseError(
            f"This workspace's store is already on PostgreSQL ({redact(ws.store_url)})."
        )
    src = Store(ws)
    before = integrity.verify_store(src)
    if not before.ok:
        raise TamperError(
            "The workspace's store does not verify, so it is not migrated (the copy would carry "
            "the alteration over): "
            + "; ".join(before.all_problems[:3])
            + ". See `privrelease audit verify`."
        )
    head = _head(src)
    target = PostgresBackend(url, ws.pg_lock_path)
    rows: dict[str, int] = {}
    with src._lock, target.transaction(lambda: None, lambda: None) as dst:
        _refuse_non_empty(dst, url)
        with (
            src.transaction() as con
        ):  # one DuckDB snapshot, no writer can come in (the lock is held)
            for table, ddl in _source_tables(src):
                rows[table] = _copy_table(con, dst, table, ddl)
    target.release()
    src.backend.release()  # nothing of this process keeps store.duckdb open any more
    _switch_and_verify(ws, url, head)
    return Migration(url, rows, head or (0, ""))


def _switch_and_verify(ws: Workspace, url: str, head: tuple[int, str] | None) -> None:
    ws.set_store_url(url)
    try:
        store = Store(ws)
        check_fingerprint_key(ws, store)
        report = integrity.verify_store(store)
        problems = report.all_problems + (
            []
            if _head(store) == head
            else [f"the copied trail ends at {_head(store)}, not at {head}"]
        )
        if problems:
            raise TamperError(
                "The copy in PostgreSQL does not verify, so the workspace stays on store.duckdb: "
                + "; ".join(problems[:3])
                + ". Drop the target database's tables and migrate again."
            )
    except BaseException:
        ws.set_store_url(None)
        raise
