"""What the audit trail says the store's tables hold, replayed entry by entry.

Every change privrelease makes to a ledger, identity or release row is one transaction that also
appends a trail entry carrying what the row became: `budget.*` the charge record, `dataset.register`
the dataset, `identity.create` the name, role and public key (a steward after the first also an
endorsement signed by an existing steward), `identity.password` a digest of the stored password
hash, `release.plan` the plan digest and every later `release.*` the new state. Replaying the trail
therefore rebuilds those rows, and a row edited, inserted or deleted behind privrelease's back
(`UPDATE identities SET role = 'steward'`, a release set back to approved) differs from its replay.

`integrity.verify_store` compares the whole replay with the tables (`audit verify`, and `release
publish` before it signs). The actions that rely on one identity or one release (approve, run,
publish, ...: release/keys.py, release/manager.py) check the row they read with `identity_problems`
or `release_problems`, which read only that row's entries and check those entries' own hashes.
Rewriting the trail itself (the chain is unkeyed) is what a signed checkpoint kept elsewhere
exposes (README, "Checkpoints").
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from accounting import ledger, trail

ROW_COLUMNS = "seq, ts, actor, action, payload, prev_hash, entry_hash"
RELEASE_FIELDS = ("state", "plan_digest", "dataset_id")


def endorsement_message(name: str, role: str, public_b64: str) -> bytes:
    """What an existing steward signs when creating an identity (release.keys.create_identity)."""
    return trail.canonical(
        {
            "purpose": "privrelease identity endorsement",
            "name": name,
            "role": role,
            "public_key": public_b64,
        }
    ).encode()


def password_digest(stored_hash: str | None) -> str | None:
    """What `identity.password` records of a stored (scrypt) password hash: its SHA-256."""
    return None if stored_hash is None else hashlib.sha256(stored_hash.encode()).hexdigest()


@dataclass
class TrailState:
    """The rows as the trail says they are now."""

    charges: dict[str, dict] = field(default_factory=dict)  # run id -> charge record
    datasets: dict[str, dict] = field(default_factory=dict)  # dataset id -> registration
    identities: dict[str, dict] = field(default_factory=dict)  # name -> role, public_key, password
    releases: dict[str, dict] = field(default_factory=dict)  # release id -> RELEASE_FIELDS
    approvals: set[tuple[str, str, str]] = field(default_factory=set)  # (release, approver, sig)
    rejections: set[tuple[str, str]] = field(default_factory=set)  # (release, steward)
    problems: list[str] = field(default_factory=list)  # what the trail itself shows is wrong


def replay(rows: Iterable[tuple]) -> TrailState:
    """Replay (seq, ts, actor, action, payload, ...) rows in write order."""
    state = TrailState()
    for seq, _ts, actor, action, payload, *_ in rows:
        try:
            p = json.loads(payload)
        except ValueError:
            continue  # an edited payload is reported by the chain check
        if not isinstance(p, dict):
            continue
        if action == "dataset.register":
            state.datasets[str(p.get("dataset_id"))] = p
        elif action.startswith("budget.") and "run_id" in p:
            state.charges[p["run_id"]] = _apply_charge(state.charges.get(p["run_id"]), action, p)
        elif action.startswith("identity."):
            _apply_identity(state, seq, action, p)
        elif action.startswith("release.") and "release_id" in p:
            _apply_release(state, actor, action, p)
    return state


def _apply_charge(current: dict | None, action: str, p: dict) -> dict:
    if "state" in p and "planned_events" in p:
        return {k: p.get(k) for k in ledger.RECORD_FIELDS}
    # Entries written before charge records existed carry only what changed.
    cur = dict(
        current
        or {
            "run_id": p["run_id"],
            "dataset_id": p.get("dataset_id"),
            "position": None,
            "planned_events": [],
            "charged_events": [],
        }
    )
    if action == "budget.reserve":
        cur.update(
            state="reserved", planned_events=p.get("events", []), dataset_id=p.get("dataset_id")
        )
    elif action == "budget.commit":
        cur.update(state="committed", charged_events=p.get("events", []))
    elif action == "budget.refund":
        cur.update(state="refunded")
    return cur


def _apply_identity(state: TrailState, seq: int, action: str, p: dict) -> None:
    name = str(p.get("name"))
    if action == "identity.create":
        role, key = p.get("role"), p.get("public_key")
        if role == "steward" and any(i["role"] == "steward" for i in state.identities.values()):
            if not _endorsed(state, p):
                state.problems.append(
                    f"identity {name}: a steward created at trail entry {seq} without a valid "
                    "endorsement by an existing steward (only the first steward needs none)"
                )
        state.identities[name] = {"role": role, "public_key": key, "password": None}
    elif action == "identity.password" and name in state.identities:
        # entries written before the digest was recorded say only that a password was set
        state.identities[name]["password"] = p.get("password_digest", "unknown")


def _endorsed(state: TrailState, p: dict) -> bool:
    endorser = state.identities.get(str(p.get("endorsed_by")))
    if endorser is None or endorser["role"] != "steward":
        return False
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(endorser["public_key"]))
        key.verify(
            bytes.fromhex(p["endorsement"]),
            endorsement_message(p["name"], p["role"], p["public_key"]),
        )
    except (InvalidSignature, ValueError, KeyError, TypeError):
        return False
    return True


def _apply_release(state: TrailState, actor: str, action: str, p: dict) -> None:
    rid = p["release_id"]
    if action == "release.plan":
        state.releases[rid] = {
            "state": "planned",
            "plan_digest": p.get("plan_digest"),
            "dataset_id": p.get("dataset_id"),
        }
        return
    if rid in state.releases and "state" in p:
        state.releases[rid]["state"] = p["state"]
    if action == "release.approve":
        state.approvals.add((rid, actor, str(p.get("signature"))))
    elif action == "release.reject":
        state.rejections.add((rid, actor))


# ------------------------------------------------------------------ the trail against the tables
def compare_identities(state: TrailState, table: list[dict]) -> list[str]:
    """Identities rows (name, role, public_key, password_hash) against the replay."""
    problems = []
    for row in table:
        problems += _identity_row_problems(state, row)
    for name in state.identities.keys() - {r["name"] for r in table}:
        problems.append(
            f"identity {name}: created in the trail but missing from the identities table (deleted)"
        )
    return problems


def _identity_row_problems(state: TrailState, row: dict) -> list[str]:
    name, rec = row["name"], state.identities.get(row["name"])
    if rec is None:
        return [
            f"identity {name} ({row['role']}): in the identities table but never created in the "
            "trail (inserted behind privrelease's back)"
        ]
    out = []
    if rec["role"] != row["role"]:
        out.append(
            f"identity {name}: role {row['role']} in the identities table but {rec['role']} in "
            "the trail (edited)"
        )
    if rec["public_key"] != row["public_key"]:
        out.append(
            f"identity {name}: public key in the identities table is not the one the trail "
            "recorded (replaced)"
        )
    if rec["password"] != "unknown" and rec["password"] != password_digest(row["password_hash"]):
        out.append(
            f"identity {name}: dashboard password hash is not the one the trail recorded (edited)"
        )
    return out


def compare_releases(state: TrailState, table: list[dict]) -> list[str]:
    """Releases rows (release_id, state, plan_digest, dataset_id) against the replay."""
    problems = []
    for row in table:
        problems += _release_row_problems(state.releases.get(row["release_id"]), row)
    for rid in state.releases.keys() - {r["release_id"] for r in table}:
        problems.append(
            f"release {rid}: planned in the trail but missing from the releases table (deleted)"
        )
    return problems


def _release_row_problems(rec: dict | None, row: dict) -> list[str]:
    rid = row["release_id"]
    if rec is None:
        return [f"release {rid}: in the releases table but never planned in the trail (inserted)"]
    out = []
    if rec["state"] != row["state"]:
        out.append(
            f"release {rid}: state {row['state']} in the releases table but {rec['state']} in "
            "the trail (edited)"
        )
    changed = [k for k in ("plan_digest", "dataset_id") if rec[k] != row[k]]
    if changed:
        out.append(
            f"release {rid}: {', '.join(changed)} in the releases table differ from the trail's "
            "release.plan entry (edited)"
        )
    return out


def compare_approvals(state: TrailState, table: list[dict]) -> list[str]:
    """Approvals rows: each approval's signature and each rejection was recorded in the trail."""
    problems = []
    for row in table:
        rid, who = row["release_id"], row["approver"]
        if str(row["decision"]).startswith("approve"):
            recorded = (rid, who, row["signature"]) in state.approvals
        else:
            recorded = (rid, who) in state.rejections
        if not recorded:
            problems.append(
                f"release {rid}: a {row['decision']} by {who} in the approvals table that the "
                "trail never recorded (inserted or edited)"
            )
    return problems


def compare_tables(con: Any, state: TrailState) -> list[str]:
    """Identities, releases and approvals against the replay (inside the caller's transaction)."""
    return (
        state.problems
        + compare_identities(
            state,
            _rows(
                con, "SELECT name, role, public_key, password_hash FROM identities ORDER BY name"
            ),
        )
        + compare_releases(
            state,
            _rows(
                con,
                "SELECT release_id, state, plan_digest, dataset_id FROM releases "
                "ORDER BY release_id",
            ),
        )
        + compare_approvals(
            state,
            _rows(
                con,
                "SELECT release_id, approver, decision, signature FROM approvals "
                "ORDER BY release_id, decided_at",
            ),
        )
    )


# ------------------------------------------------------------------ one row, for an action
def identity_problems(con: Any, name: str) -> list[str]:
    """The identity's row against its trail entries. Every identity entry is replayed (a steward's
    endorsement is checked against the endorser's recorded key); edited entries count when they are
    this identity's or its endorser's (damage elsewhere is `audit verify`'s to report, and must not
    keep an auditor from signing in to see it)."""
    entries = _entries(con, "action IN (?, ?)", ["identity.create", "identity.password"])
    rows = _rows(
        con, "SELECT name, role, public_key, password_hash FROM identities WHERE name = ?", [name]
    )
    state = replay(entries)
    concerned = {name} | {
        _payload(e).get("endorsed_by") for e in entries if _payload(e).get("name") == name
    }
    problems = _edited_entries([e for e in entries if _payload(e).get("name") in concerned])
    problems += [p for p in state.problems if p.startswith(f"identity {name}:")]
    if rows:
        problems += _identity_row_problems(state, rows[0])
    return problems


def _payload(entry: tuple) -> dict:
    try:
        p = json.loads(entry[4])
    except ValueError:
        return {}
    return p if isinstance(p, dict) else {}


def release_problems(con: Any, release_id: str) -> list[str]:
    """The release's row (state, plan digest, dataset) against its trail entries."""
    needle = f'"release_id":{trail.canonical(release_id)}'
    entries = _entries(con, "action LIKE ? AND position(? IN payload) > 0", ["release.%", needle])
    rows = _rows(
        con,
        "SELECT release_id, state, plan_digest, dataset_id FROM releases WHERE release_id = ?",
        [release_id],
    )
    problems = _edited_entries(entries)
    if rows:
        problems += _release_row_problems(replay(entries).releases.get(release_id), rows[0])
    return problems


def _entries(con: Any, where: str, params: list) -> list[tuple]:
    return con.execute(
        f"SELECT {ROW_COLUMNS} FROM audit_trail WHERE {where} ORDER BY seq", params
    ).fetchall()


def _edited_entries(entries: list[tuple]) -> list[str]:
    return [
        f"trail entry {seq} ({action}): content does not match its hash (edited)"
        for seq, ts, actor, action, payload, prev, stored in entries
        if trail.entry_hash(seq, ts, actor, action, payload, prev) != stored
    ]


def _rows(con: Any, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
