"""Append-only, hash-chained audit trail (DESIGN.md rule 7).

Each entry's hash covers its sequence number, time, actor, action, payload and the previous entry's
hash, so editing, deleting or reordering any entry breaks the chain. Deleting the *last* entries
leaves a valid shorter chain; that is caught by the head recorded in `trail.head` (written in the
same transaction) and, for anyone outside, by the head hash pinned in every signed bundle.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import duckdb

from accounting.store import Store

GENESIS = "0" * 64


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def entry_hash(seq: int, ts: str, actor: str, action: str, payload: str, prev_hash: str) -> str:
    body = canonical({"seq": seq, "ts": ts, "actor": actor, "action": action, "payload": payload, "prev": prev_hash})
    return hashlib.sha256(body.encode()).hexdigest()


def append(con: duckdb.DuckDBPyConnection, store: Store, actor: str, action: str, payload: dict) -> tuple[int, str]:
    """Append one entry inside the caller's transaction; returns (seq, hash) of the new head."""
    row = con.execute("SELECT seq, entry_hash FROM audit_trail ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = (row[0] + 1, row[1]) if row else (1, GENESIS)
    ts, text = now(), canonical(payload)
    h = entry_hash(seq, ts, actor, action, text, prev)
    con.execute("INSERT INTO audit_trail VALUES (?, ?, ?, ?, ?, ?, ?)", [seq, ts, actor, action, text, prev, h])
    store.after_commit.append(lambda: store.workspace.trail_head_path.write_text(f"{seq} {h}\n"))
    return seq, h


@dataclass
class TrailVerification:
    ok: bool
    length: int
    head_hash: str
    problems: list[str] = field(default_factory=list)
    broken_seqs: list[int] = field(default_factory=list)


def verify_rows(rows: list[tuple], recorded_head: tuple[int, str] | None) -> TrailVerification:
    """Check a trail given as (seq, ts, actor, action, payload, prev_hash, entry_hash) rows in storage order."""
    problems: list[str] = []
    broken: list[int] = []
    prev = GENESIS
    for expected_seq, (seq, ts, actor, action, payload, prev_hash, stored) in enumerate(rows, start=1):
        if seq != expected_seq:
            problems.append(f"entry {seq}: expected sequence number {expected_seq} (an entry was deleted or moved)")
            broken.append(seq)
        if prev_hash != prev:
            problems.append(f"entry {seq}: does not link to the previous entry (deleted, inserted or reordered)")
            broken.append(seq)
        if entry_hash(seq, ts, actor, action, payload, prev_hash) != stored:
            problems.append(f"entry {seq} ({action}): content does not match its hash (edited)")
            broken.append(seq)
        prev = stored
    head = rows[-1][6] if rows else GENESIS
    if recorded_head is not None and rows and (len(rows), head) != recorded_head:
        problems.append(
            f"chain ends at entry {len(rows)} {head[:12]}… but the workspace recorded head entry "
            f"{recorded_head[0]} {recorded_head[1][:12]}… (entries removed from the end or the head file edited)"
        )
    return TrailVerification(not problems, len(rows), head, problems, sorted(set(broken)))


def read_rows(store: Store) -> list[tuple]:
    with store.transaction() as con:
        # Storage order, not ORDER BY seq: a reordering must show up, not be sorted away.
        return con.execute("SELECT seq, ts, actor, action, payload, prev_hash, entry_hash FROM audit_trail ORDER BY rowid").fetchall()


def recorded_head(store: Store) -> tuple[int, str] | None:
    path = store.workspace.trail_head_path
    if not path.exists():
        return None
    seq, h = path.read_text().split()
    return int(seq), h


def verify(store: Store) -> TrailVerification:
    return verify_rows(read_rows(store), recorded_head(store))


def entries(store: Store, limit: int | None = None) -> list[dict]:
    sql = "SELECT seq, ts, actor, action, payload, entry_hash FROM audit_trail ORDER BY seq DESC"
    rows = store.query(sql + (f" LIMIT {int(limit)}" if limit else ""))
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows
