"""Dashboard passwords: scrypt hashes in identities.password_hash, set_password / check_password."""
from __future__ import annotations

import base64
import hashlib

import pytest

from accounting import trail
from accounting.errors import PrivReleaseError
from release.auth import check_password, hash_password, set_password, verify_hash
from release import keys


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
    expected = hashlib.scrypt(b"correct horse", salt=salt, n=2**14, r=8, p=1, maxmem=64 * 2**20, dklen=32)
    assert base64.b64decode(hash_b64) == expected
    assert verify_hash(h1, "correct horse") and not verify_hash(h1, "correct horsE")


@pytest.mark.parametrize("stored", [None, "", "plain", "scrypt$1$2$3", "bcrypt$16384$8$1$AAAA$AAAA",
                                    "scrypt$x$8$1$AAAA$AAAA", "scrypt$16384$8$1$!!!$AAAA"])
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
    assert entries[0]["payload"] == {"name": "bob"} and entries[0]["actor"] == "bob"
    assert "auditor-pass" not in str(people.query("SELECT * FROM audit_trail"))
    v = trail.verify(people)
    assert v.ok and v.length == before + 1


@pytest.mark.parametrize("name, password, words", [
    ("alice", "short", "at least 8"),
    ("alice", "", "at least 8"),
    ("alice", None, "at least 8"),
    ("nobody", "long-enough-pass", "No identity named 'nobody'"),
])
def test_bad_input_is_refused_and_changes_nothing(people, name, password, words):
    before = trail.verify(people).length
    with pytest.raises(PrivReleaseError, match=words):
        set_password(people, name, password)
    assert trail.verify(people).length == before
    assert all(i.password_hash is None for i in keys.list_identities(people))
