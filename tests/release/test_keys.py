"""Identities, Ed25519 key files, signatures and role checks (release/keys.py)."""

from __future__ import annotations

import base64
import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization

from accounting import trail
from accounting.errors import DatasetConflictError, PermissionDeniedError, PrivReleaseError
from accounting.store import Store, Workspace
from release import keys


@pytest.fixture
def store(tmp_path) -> Store:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    return Store(ws)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_create_identity_writes_private_key_0600_and_records_it(store):
    ident = keys.create_identity(store, "alice", "steward", actor="admin")
    ws = store.workspace
    priv, pub = keys.private_key_path(ws, "alice"), keys.public_key_path(ws, "alice")
    assert _mode(priv) == 0o600
    assert b"BEGIN PRIVATE KEY" in priv.read_bytes() and b"BEGIN PUBLIC KEY" in pub.read_bytes()
    # The stored public key is the raw 32 bytes of the key in the .pub file and matches the private key.
    raw = keys.load_public_key(pub).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert len(raw) == 32 and base64.b64decode(ident.public_key) == raw
    assert keys.raw_public_bytes(keys.load_private_key(ws, "alice").public_key()) == raw
    assert ident.key_id == hashlib.sha256(raw).hexdigest()
    assert keys.get_identity(store, "alice") == ident and ident.password_hash is None
    # Recorded in the (valid) audit trail, in the same transaction.
    last = trail.entries(store, limit=1)[0]
    assert last["action"] == "identity.create" and last["actor"] == "admin"
    assert last["payload"]["name"] == "alice" and last["payload"]["role"] == "steward"
    assert trail.verify(store).ok


def test_private_key_is_0600_even_with_permissive_umask(store):
    old = os.umask(0)
    try:
        keys.create_identity(store, "bob", "auditor")
        release_pub = keys.ensure_release_key(store.workspace)
    finally:
        os.umask(old)
    ws = store.workspace
    assert _mode(keys.private_key_path(ws, "bob")) == 0o600
    assert _mode(keys.private_key_path(ws, "release")) == 0o600
    assert _mode(release_pub) == 0o644


def test_duplicate_and_unknown_role_and_bad_names_are_refused(store):
    keys.create_identity(store, "alice", "steward")
    before = keys.private_key_path(store.workspace, "alice").read_bytes()
    with pytest.raises(DatasetConflictError, match="already exists"):
        keys.create_identity(store, "alice", "consumer")
    with pytest.raises(PrivReleaseError, match="Unknown role 'admin'.*steward, auditor, consumer"):
        keys.create_identity(store, "carol", "admin")
    for bad in ["", "../evil", "a/b", ".hidden", "release", "fingerprint", "x" * 65]:
        with pytest.raises(PrivReleaseError):
            keys.create_identity(store, bad, "consumer")
    # The store and key files are as before: one identity, the original key untouched.
    assert [i.name for i in keys.list_identities(store)] == ["alice"]
    assert keys.get_identity(store, "alice").role == "steward"
    assert keys.private_key_path(store.workspace, "alice").read_bytes() == before
    assert not keys.private_key_path(store.workspace, "carol").exists()
    assert [e["action"] for e in trail.entries(store)].count("identity.create") == 1


def test_failed_transaction_leaves_no_key_files(store, monkeypatch):
    def broken_append(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(keys.trail, "append", broken_append)
    with pytest.raises(RuntimeError):
        keys.create_identity(store, "dave", "consumer")
    monkeypatch.undo()
    ws = store.workspace
    assert (
        not keys.private_key_path(ws, "dave").exists()
        and not keys.public_key_path(ws, "dave").exists()
    )
    assert keys.list_identities(store) == []
    assert keys.create_identity(store, "dave", "consumer").name == "dave"  # and it can be retried


def test_orphan_key_file_is_not_overwritten(store):
    orphan = keys.private_key_path(store.workspace, "erin")
    orphan.write_bytes(b"someone else's key")
    with pytest.raises(PrivReleaseError, match="already exists"):
        keys.create_identity(store, "erin", "consumer")
    assert orphan.read_bytes() == b"someone else's key"
    assert keys.list_identities(store) == []


def test_list_and_get_identities(store):
    for name, role in [("zed", "consumer"), ("amy", "auditor"), ("sam", "steward")]:
        keys.create_identity(store, name, role)
    assert [(i.name, i.role) for i in keys.list_identities(store)] == [
        ("amy", "auditor"),
        ("sam", "steward"),
        ("zed", "consumer"),
    ]
    with pytest.raises(keys.UnknownIdentityError, match="No identity named 'nobody'"):
        keys.get_identity(store, "nobody")


def test_sign_verify_round_trip_and_failures(store):
    a = keys.create_identity(store, "alice", "steward")
    b = keys.create_identity(store, "bob", "steward", endorser="alice")
    ws = store.workspace
    sig = keys.sign(ws, "alice", b"plan digest 123")
    assert len(sig) == 64
    assert keys.verify_signature(a.public_key_object(), b"plan digest 123", sig)
    # Every accepted public key form works: PEM path, raw bytes, base64 text.
    assert keys.verify_signature(keys.public_key_path(ws, "alice"), b"plan digest 123", sig)
    assert keys.verify_signature(a.public_key_bytes, b"plan digest 123", sig)
    assert keys.verify_signature(a.public_key, b"plan digest 123", sig)
    assert not keys.verify_signature(a.public_key, b"plan digest 124", sig)  # other data
    assert not keys.verify_signature(b.public_key, b"plan digest 123", sig)  # other key
    assert not keys.verify_signature(
        a.public_key, b"plan digest 123", sig[:-1] + bytes([sig[-1] ^ 1])
    )
    assert not keys.verify_signature(a.public_key, b"plan digest 123", b"short")
    with pytest.raises(keys.KeyFileError):
        keys.verify_signature(b"not a key", b"x", sig)


def test_load_private_key_errors(store):
    ws = store.workspace
    with pytest.raises(keys.KeyFileError, match="No private key for 'ghost'"):
        keys.load_private_key(ws, "ghost")
    keys.create_identity(store, "alice", "steward")
    path = keys.private_key_path(ws, "alice")
    os.chmod(path, 0o644)
    with pytest.raises(keys.KeyFileError, match="chmod 600"):
        keys.sign(ws, "alice", b"x")
    os.chmod(path, 0o600)
    path.write_bytes(b"garbage")
    with pytest.raises(keys.KeyFileError, match="could not be read"):
        keys.load_private_key(ws, "alice")


def test_release_key_is_created_once_and_exported(store):
    ws = store.workspace
    pub = keys.ensure_release_key(ws)
    assert pub == ws.keys / "release.pub"
    first = pub.read_bytes()
    assert keys.ensure_release_key(ws) == pub and pub.read_bytes() == first  # idempotent: same key
    pub.write_bytes(b"edited")  # the export is derived from the private key and repaired
    keys.ensure_release_key(ws)
    assert pub.read_bytes() == first
    sig = keys.sign(ws, keys.RELEASE_KEY, b"bundle")
    assert keys.verify_signature(pub, b"bundle", sig)
    assert keys.list_identities(store) == []  # the platform key is not a person's identity


def test_require_role():
    steward = keys.Identity("sam", "steward", base64.b64encode(bytes(32)).decode(), "t")
    consumer = keys.Identity("con", "consumer", base64.b64encode(bytes(32)).decode(), "t")
    assert keys.require_role(steward, "steward") is steward
    assert keys.require_role(consumer, "auditor", "consumer") is consumer
    with pytest.raises(
        PermissionDeniedError, match="'con' is a consumer; this action needs the steward role"
    ):
        keys.require_role(consumer, "steward")
    with pytest.raises(PermissionDeniedError, match="steward or auditor"):
        keys.require_role(consumer, "steward", "auditor")
