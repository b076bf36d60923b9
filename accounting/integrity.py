"""The auditor's check of the whole store: the hash chain, the ledger, identities and releases
replayed from the trail (accounting/replay.py), and steward-signed checkpoints of the trail head.

The charges table is what `budget show` reads; the trail is what every change was recorded as.
Each budget.* entry carries the charge row after the change (ledger.charge_record), so the spend of
every dataset can be recomputed from the trail alone and compared with the tables: an `UPDATE
charges SET state='refunded'` or a deleted charge shows up as a difference. Whoever can write the
store can still recompute the (unkeyed) chain; a checkpoint signed with a steward's Ed25519 key and
kept outside the workspace pins the chain up to its entry, so that rewrite needs a steward's key.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from accounting import curve, ledger, replay, trail
from accounting.errors import PrivReleaseError, TamperError
from accounting.events import events_from_text
from accounting.store import Store

CHECKPOINT_PURPOSE = "privrelease audit-trail checkpoint"
CHECKPOINT_DIR = "checkpoints"
DATASET_FIELDS = ("name", "record_count", "epsilon_cap", "delta_cap", "fingerprint")
SPEND_TOLERANCE = 1e-9


@dataclass
class IntegrityReport:
    trail: trail.TrailVerification
    # ledger and checkpoint problems (chain ones are in trail)
    problems: list[str] = field(default_factory=list)
    spend: list[dict] = field(default_factory=list)  # per dataset: trail vs tables
    checkpoints: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.trail.ok and not self.problems

    @property
    def status(self) -> str:
        return "altered" if not self.ok else self.trail.status

    @property
    def all_problems(self) -> list[str]:
        return self.trail.problems + self.problems

    @property
    def pinned_seq(self) -> int:
        """The last entry a valid signed checkpoint pins (0: none)."""
        return max((int(c["seq"]) for c in self.checkpoints if c["ok"]), default=0)

    @property
    def unpinned_entries(self) -> int:
        """Entries after the last signed checkpoint: an unkeyed chain, so deleting them and
        rewriting trail.head is seen by no check but a later checkpoint (README, "Checkpoints")."""
        return max(0, self.trail.length - self.pinned_seq)


# ------------------------------------------------------------------ ledger replay
def _counted(record: dict) -> list:
    key = {"reserved": "planned_events", "committed": "charged_events"}.get(
        str(record.get("state"))
    )
    return list(record.get(key) or []) if key else []


def _compare_charges(trail_charges: dict[str, dict], table: list[dict]) -> list[str]:
    problems = []
    in_table = {r["run_id"]: ledger.charge_record(r) for r in table}
    for run_id, row in in_table.items():
        rec = trail_charges.get(run_id)
        if rec is None:
            problems.append(
                f"charge {run_id}: in the charges table but never recorded in the trail (inserted)"
            )
            continue
        diff = [k for k in ledger.RECORD_FIELDS if rec.get(k) is not None and rec.get(k) != row[k]]
        if diff:
            problems.append(
                f"charge {run_id}: the table's {', '.join(diff)} differ from the trail (trail: "
                f"state {rec.get('state')}; table: state {row['state']}) — edited"
            )
    for run_id in trail_charges.keys() - in_table.keys():
        problems.append(
            f"charge {run_id}: recorded in the trail ({trail_charges[run_id].get('state')}) but "
            "missing from the charges table (deleted)"
        )
    return problems


def _spend(history_json: list, delta: float) -> float:
    if not history_json:
        return 0.0
    # The sum of per-event RDP curves (cached per distinct event): the same epsilon as composing the
    # history.
    # inf after a non-DP release
    return curve.curve_of(events_from_text(json.dumps(history_json))).epsilon(delta)


def _registration_problems(ds: dict, rec: dict | None) -> list[str]:
    """A dataset row never registered in the trail, or edited since its registration entry."""
    if rec is None:
        return [f"dataset {ds['name']}: in the datasets table but never registered in the trail"]
    changed = [k for k in DATASET_FIELDS if k in rec and rec[k] != ds[k]]
    if changed:
        return [
            f"dataset {ds['name']}: {', '.join(changed)} "
            "differ from its registration entry (edited)"
        ]
    return []


def reconcile(store: Store, rows: list[tuple]) -> tuple[list[str], list[dict]]:
    """Replay the trail and compare with the datasets, charges, identities, releases and approvals
    tables; returns (problems, spend table)."""
    state = replay.replay(rows)
    trail_charges, trail_datasets = state.charges, state.datasets
    with store.transaction() as con:
        table = ledger._rows(con, "SELECT * FROM charges ORDER BY position")
        datasets = ledger._rows(con, "SELECT * FROM datasets")
        rows_problems = replay.compare_tables(con, state)
    problems = _compare_charges(trail_charges, table)
    spend = []
    for ds in datasets:
        rec = trail_datasets.get(ds["dataset_id"])
        problems.extend(_registration_problems(ds, rec))
        delta = float(rec["delta_cap"]) if rec and "delta_cap" in rec else ds["delta_cap"]

        def mine(recs, ds=ds):
            ordered = sorted(recs, key=lambda r: r.get("position") or 0)
            return [
                e for r in ordered if r.get("dataset_id") == ds["dataset_id"] for e in _counted(r)
            ]

        by_trail = _spend(mine(trail_charges.values()), delta)
        by_table = _spend(mine(ledger.charge_record(r) for r in table), delta)
        agree = by_trail == by_table or abs(by_trail - by_table) <= SPEND_TOLERANCE
        if not agree:
            problems.append(
                f"dataset {ds['name']}: spend recomputed from the trail is epsilon {by_trail:.6g} "
                f"(RDP) but the ledger tables give {by_table:.6g}"
            )
        spend.append(
            {
                "dataset": ds["name"],
                "dataset_id": ds["dataset_id"],
                "epsilon_rdp_trail": by_trail,
                "epsilon_rdp_ledger": by_table,
                "agree": agree,
            }
        )
    with store.transaction() as con:
        for row in curve.verify(con):
            if not row["agree"]:
                problems.append(
                    f"dataset {row['dataset']}: the running RDP curve gives epsilon "
                    f"{row['epsilon_rdp_running']:.6g} but the stored events give "
                    f"{row['epsilon_rdp_recomputed']:.6g} (the curve was edited)"
                )
    for missing in trail_datasets.keys() - {d["dataset_id"] for d in datasets}:
        problems.append(
            f"dataset {trail_datasets[missing].get('name')}: registered in the trail but missing "
            "from the datasets table (deleted)"
        )
    return problems + rows_problems, spend


# ------------------------------------------------------------------ checkpoints
def _message(cp: dict) -> bytes:
    body = {
        k: cp[k] for k in ("purpose", "seq", "head_hash", "created_at", "steward", "public_key")
    }
    return trail.canonical(body).encode()


def make_checkpoint(store: Store, steward: str, private_key: Ed25519PrivateKey) -> dict:
    """Record a checkpoint in the trail and sign the head that entry makes, with a steward's key;
    write it to checkpoints/ (0600). The checkpoint pins every entry up to and including its own
    record. Refused if the store does not verify: a signature must never vouch for an altered
    store."""
    report = verify_store(store)
    if not report.ok:
        raise TamperError(
            "The store does not verify, so its head cannot be checkpointed: "
            + "; ".join(report.all_problems[:3])
        )
    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    public_key = base64.b64encode(raw).decode("ascii")
    with store.transaction() as con:
        if con.execute("SELECT 1 FROM audit_trail LIMIT 1").fetchone() is None:
            raise PrivReleaseError("The audit trail is empty; there is nothing to checkpoint yet.")
        seq, head = trail.append(
            con, store, steward, "trail.checkpoint", {"steward": steward, "public_key": public_key}
        )
        cp: dict[str, Any] = {
            "purpose": CHECKPOINT_PURPOSE,
            "seq": int(seq),
            "head_hash": head,
            "created_at": trail.now(),
            "steward": steward,
            "public_key": public_key,
        }
        cp["signature"] = private_key.sign(_message(cp)).hex()
    path = store.workspace.root / CHECKPOINT_DIR / f"{cp['seq']:08d}-{cp['head_hash'][:12]}.json"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cp, f, indent=2, sort_keys=True)
    return {**cp, "path": str(path)}


def load_checkpoint(path: Path) -> dict:
    try:
        cp = json.loads(Path(path).read_text())
        _message(cp)
        bytes.fromhex(cp["signature"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PrivReleaseError(
            f"{path} is not a privrelease checkpoint ({type(e).__name__}: {e}); give a file "
            "written by `privrelease audit checkpoint`."
        ) from None
    return cp


def check_checkpoint(
    cp: dict,
    rows: list[tuple],
    steward_keys: dict[str, str],
    trusted_keys: list[bytes] | None = None,
) -> list[str]:
    """Problems of one checkpoint against the stored chain. The signer must be a trusted key (given
    from outside the store) or, failing that, a steward's key registered in the store."""
    where = f"checkpoint of entry {cp.get('seq')} by {cp.get('steward')}"
    try:
        raw = base64.b64decode(cp["public_key"])
        Ed25519PublicKey.from_public_bytes(raw).verify(bytes.fromhex(cp["signature"]), _message(cp))
    except (InvalidSignature, ValueError, KeyError):
        return [f"{where}: the signature is not valid (forged or edited checkpoint)"]
    if cp.get("purpose") != CHECKPOINT_PURPOSE:
        return [f"{where}: not a trail checkpoint"]
    if trusted_keys is not None and raw not in trusted_keys:
        return [f"{where}: signed by a key other than the trusted steward key(s) given"]
    if trusted_keys is None and steward_keys.get(cp["steward"]) != cp["public_key"]:
        return [f"{where}: signed by a key that is not steward {cp['steward']}'s registered key"]
    seq = int(cp["seq"])
    if seq > len(rows):
        return [
            f"{where}: the chain now has only {len(rows)} "
            "entries (entries after a signed head were removed)"
        ]
    if rows[seq - 1][0] != seq or rows[seq - 1][6] != cp["head_hash"]:
        return [
            f"{where}: the chain's entry {seq} no longer has the signed hash "
            f"{cp['head_hash'][:12]}… (the trail was rewritten and its hashes recomputed)"
        ]
    return []


def verify_store(
    store: Store, checkpoint_files: Iterable[Path] = (), trusted_keys: list[bytes] | None = None
) -> IntegrityReport:
    """Chain + head, ledger replayed from the trail, and every checkpoint (the workspace's and those
    given)."""
    with store._lock:  # one consistent snapshot: no commit lands between the reads
        rows = trail.read_rows(store)
        v = trail.verify_rows(
            rows,
            trail.recorded_head(store),
            trail._read_head(store.workspace.root / trail.PENDING_NAME),
            shared=store.shared,
            stored_order=trail.read_storage_order(store),
        )
        problems, spend = reconcile(store, rows)
        stewards = {
            r["name"]: r["public_key"]
            for r in store.query("SELECT name, public_key FROM identities WHERE role = 'steward'")
        }
    report = IntegrityReport(v, problems, spend)
    folder = store.workspace.root / CHECKPOINT_DIR
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for path in [*files, *map(Path, checkpoint_files)]:
        cp = load_checkpoint(path)
        found = check_checkpoint(cp, rows, stewards, trusted_keys)
        report.problems += found
        report.checkpoints.append(
            {"path": str(path), "seq": cp.get("seq"), "steward": cp.get("steward"), "ok": not found}
        )
    return report
