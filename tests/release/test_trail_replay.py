"""Identities and release states replayed from the audit trail (issue 42): edits made directly in
store.duckdb that the chain alone does not show are seen by `audit verify` and refused by the actions
that rely on them (approve, run, publish, sign-in)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from accounting import integrity, ledger, trail
from accounting.errors import TamperError
from accounting.store import Store, Workspace
from release import auth, keys, manager
from release.cli import app
from tests.support.dashboard_workspace import approved_small_release, ksalsa_spec


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """alice (first steward), bob (auditor), carol (consumer), a k-SALSA release approved and then
    rejected, and one planned: built once, copied for each test (every test edits its copy)."""
    root = tmp_path_factory.mktemp("replay") / "ws"
    ws = Workspace(root)
    ws.init()
    store = Store(ws)
    keys.create_identity(store, "alice", "steward")
    keys.create_identity(store, "bob", "auditor", actor="alice")
    keys.create_identity(store, "carol", "consumer", actor="alice")
    auth.set_password(store, "alice", "steward-pass-1")
    rejected = approved_small_release(store, root)
    manager.reject(store, rejected, "alice", "wrong k")
    planned = manager.create_plan(store, ksalsa_spec("mnist-small"), "alice").release_id
    (root / "ids").write_text(f"{rejected} {planned}")
    assert integrity.verify_store(store).ok
    store.backend.release()  # the copies are made from a closed file
    return root


@pytest.fixture
def ws(template, tmp_path) -> Workspace:
    shutil.copytree(template, tmp_path / "ws", symlinks=True)
    shutil.copy2(template.parent / "mnist-small.npz", tmp_path / "mnist-small.npz")
    return Workspace(tmp_path / "ws")


def _ids(ws: Workspace) -> tuple[str, str]:
    rejected, planned = (ws.root / "ids").read_text().split()
    return rejected, planned


def _problems(ws: Workspace) -> list[str]:
    report = integrity.verify_store(Store(ws))
    assert not report.ok and report.status == "altered"
    return report.problems


def _audit_verify(ws: Workspace) -> int:
    return CliRunner().invoke(app, ["--workspace", str(ws.root), "audit", "verify"]).exit_code


def test_honest_history_replays_to_the_tables(ws):
    report = integrity.verify_store(Store(ws))
    assert report.ok and report.status == "intact", report.all_problems


def test_a_role_changed_in_the_table_is_seen_and_cannot_approve(ws, tamper):
    _, planned = _ids(ws)
    tamper(ws.db_path, "UPDATE identities SET role = 'steward' WHERE name = 'carol'")
    assert any("identity carol: role steward" in p and "consumer" in p for p in _problems(ws))
    assert _audit_verify(ws) == 1
    store = Store(ws)
    rel = manager.get_release(store, planned)
    with pytest.raises(TamperError, match="Identity 'carol'.*not what the audit trail recorded"):
        manager.approve(store, planned, "carol", digest=rel.plan_digest, acknowledge_non_dp=True)
    assert manager.get_release(store, planned).state == "planned"
    assert manager.approvals(store, planned) == []


def _key_files(ws: Workspace, name: str) -> str:
    """An attacker's own key pair in keys/ (as `keys create` would write it); the public key, base64."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = keys.private_key_path(ws, name)
    path.write_bytes(pem)
    path.chmod(0o600)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def test_a_steward_inserted_without_endorsement_is_seen_and_cannot_approve(ws, tamper):
    _, planned = _ids(ws)
    public = _key_files(ws, "mallory")
    tamper(
        ws.db_path,
        f"INSERT INTO identities VALUES ('mallory', 'steward', '{public}', NULL, '2026-01-01')",
    )
    assert any("identity mallory (steward)" in p and "never created" in p for p in _problems(ws))
    store = Store(ws)
    rel = manager.get_release(store, planned)
    with pytest.raises(TamperError, match="mallory"):
        manager.approve(store, planned, "mallory", digest=rel.plan_digest, acknowledge_non_dp=True)
    assert manager.get_release(store, planned).state == "planned"


def test_a_steward_written_into_the_trail_too_needs_an_existing_stewards_endorsement(ws, tamper):
    """The attacker also appends an identity.create entry and rewrites the head (the chain is
    unkeyed): only a steward's key can endorse a new steward, so the replay still refuses it."""
    _, planned = _ids(ws)
    public = _key_files(ws, "mallory")
    store = Store(ws)
    seq, prev = store.query(trail.HEAD_SQL)[0].values()
    payload = trail.canonical(
        {"name": "mallory", "role": "steward", "public_key": public, "endorsed_by": "alice"}
        | {"endorsement": "00" * 64}
    )
    ts = trail.now()
    h = trail.entry_hash(seq + 1, ts, "alice", "identity.create", payload, prev)
    store.backend.release()
    tamper(
        ws.db_path,
        f"INSERT INTO identities VALUES ('mallory', 'steward', '{public}', NULL, '{ts}')",
        f"INSERT INTO audit_trail VALUES ({seq + 1}, '{ts}', 'alice', 'identity.create', "
        f"'{payload}', '{prev}', '{h}')",
    )
    ws.trail_head_path.write_text(f"{seq + 1} {h}\n")
    assert trail.verify(Store(ws)).ok  # the chain alone is intact
    assert any("without a valid endorsement" in p for p in _problems(ws))
    rel = manager.get_release(Store(ws), planned)
    with pytest.raises(TamperError, match="endorsement"):
        manager.approve(
            Store(ws), planned, "mallory", digest=rel.plan_digest, acknowledge_non_dp=True
        )


def test_a_rejected_release_set_back_to_approved_is_seen_and_cannot_run(ws, tamper):
    rejected, _ = _ids(ws)
    tamper(ws.db_path, f"UPDATE releases SET state = 'approved' WHERE release_id = '{rejected}'")
    assert any(
        f"release {rejected}: state approved" in p and "rejected in the trail" in p
        for p in _problems(ws)
    )
    assert _audit_verify(ws) == 1
    store = Store(ws)
    with pytest.raises(TamperError, match=f"Release {rejected}.*not what the audit trail"):
        manager.run_release(store, rejected, "alice")
    assert ledger.get_charge(store, rejected) is None  # nothing reserved, no data read
    assert manager.get_release(store, rejected).state == "approved"  # left as found


def test_an_edited_plan_digest_and_an_inserted_approval_are_seen(ws, tamper):
    rejected, planned = _ids(ws)
    tamper(
        ws.db_path,
        f"UPDATE releases SET plan_digest = '{'0' * 64}' WHERE release_id = '{planned}'",
        f"INSERT INTO approvals VALUES ('{rejected}', 'alice', 'approve', 'x', 'ab', NULL, 'now')",
    )
    problems = _problems(ws)
    assert any(f"release {planned}: plan_digest" in p for p in problems)
    assert any(f"release {rejected}: a approve by alice" in p for p in problems)


def test_a_password_hash_written_into_the_table_cannot_sign_in(ws, tamper):
    stored = auth.hash_password("attacker-pass-1")
    tamper(ws.db_path, f"UPDATE identities SET password_hash = '{stored}' WHERE name = 'alice'")
    assert any("identity alice: dashboard password" in p for p in _problems(ws))
    result = auth.sign_in(Store(ws), "alice", "attacker-pass-1")
    assert result.identity is None and "audit trail" in result.message
    assert auth.sign_in(Store(ws), "alice", "steward-pass-1").identity is None  # replaced


def _cli(ws: Workspace, *args: str):
    return CliRunner().invoke(app, ["--workspace", str(ws.root), *args])


def test_the_checkpoint_routine_pins_the_tail_that_audit_verify_alone_cannot(ws, tmp_path):
    """The stated limit of an unkeyed chain: delete the last entry and rewrite trail.head, and
    `audit verify` finds nothing. A steward's checkpoint, kept off the machine, pins every entry up
    to its own record; verify counts what comes after it."""
    r = _cli(ws, "audit", "verify", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["unpinned_entries"] > 0  # none signed yet
    outside = tmp_path / "auditor" / "checkpoint.json"
    outside.parent.mkdir()
    r = _cli(ws, "audit", "checkpoint", "--as", "alice", "--out", str(outside))
    assert r.exit_code == 0, r.output
    report = json.loads(_cli(ws, "audit", "verify", "--json").output)
    assert report["ok"] and report["unpinned_entries"] == 0  # its own record is pinned too
    auth.set_password(Store(ws), "bob", "auditor-pass-1")
    assert json.loads(_cli(ws, "audit", "verify", "--json").output)["unpinned_entries"] == 1

    # The attacker removes the last two entries (the checkpoint's record among them), rewrites
    # the head and deletes the workspace's copy of the checkpoint.
    store = Store(ws)
    n = trail.verify(store).length
    last = store.query(f"SELECT entry_hash FROM audit_trail WHERE seq = {n - 2}")[0]["entry_hash"]
    store.backend.release()
    con = duckdb.connect(str(ws.db_path))
    con.execute(f"DELETE FROM audit_trail WHERE seq >= {n - 1}")
    con.execute("UPDATE identities SET password_hash = NULL WHERE name = 'bob'")
    con.close()
    ws.trail_head_path.write_text(f"{n - 2} {last}\n")
    shutil.rmtree(ws.root / integrity.CHECKPOINT_DIR)
    assert _cli(ws, "audit", "verify").exit_code == 0  # the limit, as README states it
    alice_pub = keys.public_key_path(ws, "alice")
    r = _cli(ws, "audit", "verify", "--checkpoint", str(outside), "--key", str(alice_pub), "--json")
    assert r.exit_code == 1
    assert any(
        "entries after a signed head were removed" in p for p in json.loads(r.output)["problems"]
    )
