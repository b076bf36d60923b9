"""Dashboard passwords: scrypt hashes in identities.password_hash, set_password / check_password."""

from __future__ import annotations

import base64
import hashlib

import pytest

from accounting import trail
from accounting.errors import PrivReleaseError
from accounting.replay import password_digest
from release import keys
from release.auth import check_password, hash_password, set_password, verify_hash


@pytest.fixture
def people(store):
    keys.create_identity(store, "alice", "steward")
    keys.create_identity(store, "bob", "auditor")
    return store


def test_hash_format_is_scrypt_with_random_salt():
    h1, h2 = hash_password("correct horse"), hash_password("correct horse")
    assert h1 != h2  # fresh 16-byte salt each time
    scheme, n, r, p, salt_b64, hash_b64 = h1.split("$")
    assert (scheme, n, r, p) == ("scrypt", str(2**14), "8", "1")
    salt = base64.b64decode(salt_b64)
    assert len(salt) == 16
    # Independently recomputed with hashlib: the stored hash is scrypt(password, salt, n=2**14, r=8, p=1).
    expected = hashlib.scrypt(
        b"correct horse", salt=salt, n=2**14, r=8, p=1, maxmem=64 * 2**20, dklen=32
    )
    assert base64.b64decode(hash_b64) == expected
    assert verify_hash(h1, "correct horse") and not verify_hash(h1, "correct horsE")


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "",
        "plain",
        "scrypt$1$2$3",
        "bcrypt$16384$8$1$AAAA$AAAA",
        "scrypt$x$8$1$AAAA$AAAA",
        "scrypt$16384$8$1$!!!$AAAA",
    ],
)
def test_malformed_stored_hash_never_matches(stored):
    assert verify_hash(stored, "anything-long") is False


def test_set_and_check_password(people):
    assert check_password(people, "alice", "whatever-123") is None  # no password set yet
    ident = set_password(people, "alice", "s3cret-pass")
    assert ident.name == "alice" and ident.password_hash.startswith("scrypt$")
    row = people.query("SELECT password_hash FROM identities WHERE name = 'alice'")[0]
    assert "s3cret-pass" not in row["password_hash"]
    ok = check_password(people, "alice", "s3cret-pass")
    assert ok is not None and ok.name == "alice" and ok.role == "steward"
    assert check_password(people, "alice", "s3cret-pasS") is None
    assert check_password(people, "alice", "") is None
    assert check_password(people, "bob", "s3cret-pass") is None  # bob has no password
    assert check_password(people, "nobody", "s3cret-pass") is None
    # Replacing the password invalidates the old one.
    set_password(people, "alice", "another-pass")
    assert check_password(people, "alice", "s3cret-pass") is None
    assert check_password(people, "alice", "another-pass").name == "alice"


def test_setting_a_password_is_in_the_trail_without_the_password(people):
    before = trail.verify(people).length
    set_password(people, "bob", "auditor-pass")
    entries = trail.entries(people, limit=1)
    assert entries[0]["action"] == "identity.password"
    stored = keys.get_identity(people, "bob").password_hash
    assert entries[0]["payload"] == {"name": "bob", "password_digest": password_digest(stored)}
    assert entries[0]["actor"] == "bob"
    assert "auditor-pass" not in str(people.query("SELECT * FROM audit_trail"))
    v = trail.verify(people)
    assert v.ok and v.length == before + 1


@pytest.mark.parametrize(
    "name, password, words",
    [
        ("alice", "short", "at least 8"),
        ("alice", "", "at least 8"),
        ("alice", None, "at least 8"),
        ("nobody", "long-enough-pass", "No identity named 'nobody'"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(people, name, password, words):
    before = trail.verify(people).length
    with pytest.raises(PrivReleaseError, match=words):
        set_password(people, name, password)
    assert trail.verify(people).length == before
    assert all(i.password_hash is None for i in keys.list_identities(people))


# ------------------------------------------------------------------ sign-in throttling, trail, sessions
def _attempts(store, name):
    return [
        r["action"]
        for r in store.query(
            "SELECT action FROM audit_trail WHERE action LIKE 'auth.%' AND payload LIKE ? ORDER BY seq",
            [f'%"name":"{name}"%'],
        )
    ]


def test_sign_in_attempts_are_trail_entries(people):
    from release.auth import sign_in

    set_password(people, "alice", "s3cret-pass")
    assert sign_in(people, "alice", "wrong-pass").identity is None
    ok = sign_in(people, "alice", "s3cret-pass")
    assert ok.identity.name == "alice" and ok.session_epoch
    assert sign_in(people, "nobody", "whatever-pass").identity is None
    assert _attempts(people, "alice") == ["auth.sign_in_failed", "auth.sign_in"]
    assert _attempts(people, "nobody") == ["auth.sign_in_failed"]
    assert "s3cret-pass" not in str(people.query("SELECT payload FROM audit_trail"))
    assert trail.verify(people).ok


def test_lockout_after_repeated_failures(people):
    import time

    from release.auth import LOCKOUT_SECONDS, MAX_FAILURES, sign_in

    set_password(people, "alice", "s3cret-pass")
    for _ in range(MAX_FAILURES):
        assert sign_in(people, "alice", "guess-guess").identity is None
    locked = sign_in(
        people, "alice", "s3cret-pass"
    )  # the right password, but locked: not even checked
    assert locked.identity is None and "Too many failed sign-ins" in locked.message
    assert (
        sign_in(people, "bob", "x" * 8).identity is None
    )  # other names are not locked by alice's failures
    later = time.time() + LOCKOUT_SECONDS + 1
    assert sign_in(people, "alice", "s3cret-pass", now=later).identity.name == "alice"
    assert _attempts(people, "alice")[-2:] == ["auth.sign_in_refused", "auth.sign_in"]
    # A success resets the count: one new failure does not lock.
    assert sign_in(people, "alice", "guess-guess").identity is None
    assert sign_in(people, "alice", "s3cret-pass").identity is not None


def test_password_change_ends_sessions(people):
    from release.auth import session_valid, sign_in

    set_password(people, "alice", "s3cret-pass")
    epoch = sign_in(people, "alice", "s3cret-pass").session_epoch
    assert session_valid(people, "alice", epoch).name == "alice"
    set_password(people, "alice", "another-pass")
    assert session_valid(people, "alice", epoch) is None
    assert (
        session_valid(people, "alice", "") is None and session_valid(people, "ghost", epoch) is None
    )


def test_dashboard_session_ends_on_password_change_and_page_value_not_echoed(tmp_path, monkeypatch):
    from accounting.store import Store, Workspace
    from tests.support.dashboard_workspace import (
        PASSWORDS,
        ROLES,
        assert_clean,
        submit_sign_in,
    )
    from tests.support.dashboard_workspace import (
        sign_in as app_sign_in,
    )

    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    for name in ("alice", "carol"):
        keys.create_identity(store, name, ROLES[name])
        set_password(store, name, PASSWORDS[name])
    monkeypatch.setenv("PRIVRELEASE_HOME", str(ws.root))
    at = app_sign_in("alice")
    set_password(store, "alice", "changed-pass-2")
    at.run()
    assert_clean(at)
    assert "user" not in at.session_state and any("password changed" in w.value for w in at.warning)
    evil = "[prize](https://evil.example/x) https://evil.example"
    at = submit_sign_in("carol", evil)
    errors = " ".join(e.value for e in at.error)
    assert "requested page does not exist" in errors and "evil" not in errors
