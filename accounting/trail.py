"""Append-only, hash-chained audit trail (ARCHITECTURE.md rule 7).

Each entry's hash covers its sequence number, time, actor, action, payload and the previous entry's
hash, so editing, deleting or reordering any entry breaks the chain. The chain's order is its
sequence numbers (`seq`: the head's + 1, given inside the store's serialised transaction), never
where the rows happen to be stored. Deleting the *last* entries leaves a valid shorter chain; that
is caught by the head recorded in `trail.head` and, for anyone outside the store, by steward-signed
checkpoints (accounting/integrity.py) and the head hash pinned in every signed bundle. The chain
itself is unkeyed: whoever can write the store can recompute it, which only a signed checkpoint
kept elsewhere exposes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from accounting.store import Store

GENESIS = "0" * 64
# The chain's last entry: max() reads only the seq column, then one primary-key lookup (ORDER BY seq
# DESC LIMIT 1 sorted the whole table: 12 ms at 100,000 entries instead of 1 ms).
HEAD_SQL = "SELECT seq, entry_hash FROM audit_trail WHERE seq = (SELECT max(seq) FROM audit_trail)"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def entry_hash(seq: int, ts: str, actor: str, action: str, payload: str, prev_hash: str) -> str:
    body = canonical(
        {
            "seq": seq,
            "ts": ts,
            "actor": actor,
            "action": action,
            "payload": payload,
            "prev": prev_hash,
        }
    )
    return hashlib.sha256(body.encode()).hexdigest()


def append(
    con: duckdb.DuckDBPyConnection, store: Store, actor: str, action: str, payload: dict
) -> tuple[int, str]:
    """Append one entry inside the caller's transaction; returns (seq, hash) of the new head.

    The head is recorded outside the table in two steps so that a crash can be told from an edit:
    `trail.head.pending` (the head this transaction will create) is written just before COMMIT and
    `trail.head` just after. A crash in between leaves pending == the stored chain's end, which
    `verify` reports as "interrupted" (not "altered") and the next append repairs."""
    # this transaction's hooks set?
    hooked = getattr(store, "_trail_hooks_of", None) is store.before_commit
    if not hooked:
        _recover_head(con, store)
    row = con.execute(HEAD_SQL).fetchone()
    seq, prev = (row[0] + 1, row[1]) if row else (1, GENESIS)
    ts, text = now(), canonical(payload)
    h = entry_hash(seq, ts, actor, action, text, prev)
    con.execute(
        "INSERT INTO audit_trail VALUES (?, ?, ?, ?, ?, ?, ?)",
        [seq, ts, actor, action, text, prev, h],
    )
    store._trail_new_head = (seq, h)
    if not hooked:  # one pair of hooks per transaction, whatever the entry count
        store._trail_hooks_of = store.before_commit
        store.before_commit.append(
            lambda: _write_head(store.workspace.root / PENDING_NAME, store._trail_new_head)
        )
        store.after_commit.append(lambda: _promote_pending(store))
    return seq, h


def append_many(
    con: duckdb.DuckDBPyConnection, store: Store, actor: str, entries: Sequence[tuple[str, dict]]
) -> tuple[int, str]:
    """Append (action, payload) entries in order inside the caller's transaction, chained as
    `append` chains them one by one; the head is read once (seeding a large store:
    `ledger.charge_many`)."""
    if not entries:
        raise ValueError("append_many needs at least one entry.")
    # recovers the head, sets the hooks
    seq, h = append(con, store, actor, entries[0][0], entries[0][1])
    ts, rows = now(), []
    for action, payload in entries[1:]:
        text, prev, seq = canonical(payload), h, seq + 1
        h = entry_hash(seq, ts, actor, action, text, prev)
        rows.append([seq, ts, actor, action, text, prev, h])
    _insert_many(con, "audit_trail", TRAIL_COLUMNS, rows)
    store._trail_new_head = (seq, h)
    return seq, h


def _insert_many(con: Any, table: str, columns: Sequence[str], rows: list[list]) -> None:
    """Insert rows in one statement on DuckDB (an Arrow table scanned by INSERT ... SELECT:
    executemany costs milliseconds a row there), one by one elsewhere."""
    if not rows:
        return
    if hasattr(con, "register"):  # DuckDB
        import pyarrow as pa

        # DuckDB's replacement scan reads the local `bulk` by its name in the SQL below
        bulk = pa.table({c: [r[i] for r in rows] for i, c in enumerate(columns)})  # noqa: F841
        con.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} FROM bulk"
        )
    else:
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        for row in rows:
            con.execute(sql, row)


PENDING_NAME = "trail.head.pending"
TRAIL_COLUMNS = ("seq", "ts", "actor", "action", "payload", "prev_hash", "entry_hash")


def _write_head(path: Path, head: tuple[int, str]) -> None:
    """Replace `path` atomically (a reader or a crash never sees a half-written head)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{head[0]} {head[1]}\n")
    os.replace(tmp, path)


def _promote_pending(store: Store) -> None:
    _write_head(store.workspace.trail_head_path, store._trail_new_head)
    (store.workspace.root / PENDING_NAME).unlink(missing_ok=True)


def _recover_head(con: duckdb.DuckDBPyConnection, store: Store) -> None:
    """Under the store lock: finish an interrupted head update, or drop a rolled-back pending
    one."""
    pending_path = store.workspace.root / PENDING_NAME
    pending = _read_head(pending_path)
    if pending is None:
        return
    row = con.execute(HEAD_SQL).fetchone()
    if isinstance(pending, tuple) and row is not None and (row[0], row[1]) == pending:
        _write_head(store.workspace.trail_head_path, pending)  # committed, head not yet recorded
    pending_path.unlink(missing_ok=True)


def _read_head(path: Path) -> tuple[int, str] | str | None:
    """(seq, hash), None if the file is absent, or a description of why it is unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or len(parts[1]) != 64:
        return f"is malformed ({text[:40]!r})"
    return int(parts[0]), parts[1]


@dataclass
class TrailVerification:
    ok: bool
    length: int
    head_hash: str
    problems: list[str] = field(default_factory=list)
    broken_seqs: list[int] = field(default_factory=list)
    # intact | interrupted (a crash between commit and head record) | altered
    status: str = "intact"
    notes: list[str] = field(default_factory=list)


def _chain_problems(rows: list[tuple]) -> tuple[list[str], list[int]]:
    problems: list[str] = []
    broken: list[int] = []
    prev = GENESIS
    for expected_seq, (seq, ts, actor, action, payload, prev_hash, stored) in enumerate(
        rows, start=1
    ):
        if seq != expected_seq:
            problems.append(
                f"entry {seq}: expected sequence number "
                f"{expected_seq} (an entry was deleted or moved)"
            )
            broken.append(seq)
        if prev_hash != prev:
            problems.append(
                f"entry {seq}: does not link to the previous entry (deleted, inserted or reordered)"
            )
            broken.append(seq)
        if entry_hash(seq, ts, actor, action, payload, prev_hash) != stored:
            problems.append(f"entry {seq} ({action}): content does not match its hash (edited)")
            broken.append(seq)
        prev = stored
    return problems, sorted(set(broken))


def verify_rows(
    rows: list[tuple],
    recorded_head: tuple[int, str] | str | None,
    pending_head: tuple[int, str] | str | None = None,
    *,
    shared: bool = False,
    stored_order: list[int] | None = None,
) -> TrailVerification:
    """Check a trail given as (seq, ts, actor, action, payload, prev_hash, entry_hash) rows in
    write order (`read_rows`), against the recorded head (and the write-ahead pending head, if a
    crash left one). With a `shared` store (PostgreSQL) other hosts append too: this workspace's
    head pins the chain up to what it last wrote. `stored_order` (DuckDB: `read_storage_order`)
    must be the write order too."""
    end = (len(rows), rows[-1][6] if rows else GENESIS)
    if shared and pending_head != end and _pinned_prefix(rows, recorded_head):
        # later entries are other hosts' (a crash of ours: pending == end)
        recorded_head = end if rows else None
    problems, broken = _chain_problems(rows)
    moved, moved_seqs = _storage_problems(stored_order)
    problems += moved
    broken = sorted(set(broken) | set(moved_seqs))
    notes: list[str] = []
    if isinstance(recorded_head, str):
        problems.append(
            f"the recorded head (trail.head) {recorded_head}; "
            "privrelease writes it atomically, so it was edited"
        )
    elif recorded_head is None and not rows:
        pass
    elif recorded_head == end:
        pass
    elif pending_head == end and _extends(rows, recorded_head):
        notes.append(
            f"the last transaction (entry {end[0]}) committed but its head record was interrupted "
            "(a crash or kill); the chain is consistent and the next write repairs the record"
        )
    elif recorded_head is None:
        problems.append(
            f"the chain has {len(rows)} entries but the "
            "workspace has no recorded head (trail.head deleted)"
        )
    else:
        problems.append(
            f"chain ends at entry {end[0]} {end[1][:12]}… but the workspace "
            f"recorded head entry {recorded_head[0]} {recorded_head[1][:12]}… "
            "(entries removed from the end or the head file edited)"
        )
    status = "altered" if problems else ("interrupted" if notes else "intact")
    return TrailVerification(not problems, len(rows), end[1], problems, broken, status, notes)


def _pinned_prefix(rows: list[tuple], recorded: tuple[int, str] | str | None) -> bool:
    """True if the recorded head is absent (this host never wrote) or an entry of the chain, hash
    included."""
    if recorded is None:
        return True
    if isinstance(recorded, str) or not 1 <= recorded[0] <= len(rows):
        return False
    row = rows[recorded[0] - 1]
    return row[0] == recorded[0] and row[6] == recorded[1]


def _extends(rows: list[tuple], recorded: tuple[int, str] | None) -> bool:
    """True if the recorded head is the entry just before the chain's end (or absent for a 1-entry
    chain)."""
    if recorded is None:
        return len(rows) == 1
    seq, h = recorded
    return seq == len(rows) - 1 and (seq == 0 or rows[seq - 1][6] == h)


ROWS_SQL = (
    "SELECT seq, ts, actor, action, payload, prev_hash, entry_hash FROM audit_trail ORDER BY seq"
)


def read_rows(store: Store) -> list[tuple]:
    """The chain in the order it was written: by `seq`, the number `append` gives each entry (the
    head's + 1) inside the store's serialised transaction, covered by the entry's hash. Where a row
    sits on disk is not that order on a shared server: PostgreSQL puts each backend's inserts in its
    own target page and refills freed space after VACUUM, so rows of two hosts, or written after a
    rolled-back one, are stored out of order."""
    with store.transaction() as con:
        return con.execute(ROWS_SQL).fetchall()


def read_storage_order(store: Store) -> list[int] | None:
    """The entries' sequence numbers in storage order, on the embedded DuckDB store only (None on a
    shared one). There one process appends at a time and only at the end, so rows stored out of
    write order mean the table was rewritten behind privrelease's back."""
    if store.shared:
        return None
    with store.transaction() as con:
        return [r[0] for r in con.execute("SELECT seq FROM audit_trail ORDER BY rowid").fetchall()]


def _storage_problems(stored: list[int] | None) -> tuple[list[str], list[int]]:
    if stored is None:
        return [], []
    out_of_order = [
        later for earlier, later in zip(stored, stored[1:], strict=False) if later < earlier
    ]
    if not out_of_order:
        return [], []
    return [
        f"entry {seq}: stored after a later entry (the table was rewritten with its entries "
        "reordered)"
        for seq in out_of_order[:5]
    ], out_of_order


def recorded_head(store: Store) -> tuple[int, str] | str | None:
    return _read_head(store.workspace.trail_head_path)


def verify(store: Store) -> TrailVerification:
    with store._lock:  # rows and head files read together, not between a commit and its head record
        return verify_rows(
            read_rows(store),
            recorded_head(store),
            _read_head(store.workspace.root / PENDING_NAME),
            shared=store.shared,
            stored_order=read_storage_order(store),
        )


def entries(store: Store, limit: int | None = None) -> list[dict]:
    sql = "SELECT seq, ts, actor, action, payload, entry_hash FROM audit_trail ORDER BY seq DESC"
    rows = store.query(sql + (f" LIMIT {int(limit)}" if limit else ""))
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows
