"""Dashboard passwords (set by `privrelease keys password`): scrypt hashes in
`identities.password_hash`.

Format: "scrypt$n$r$p$salt_b64$hash_b64". The password itself is never stored or logged; setting one
appends an `identity.password` entry to the audit trail (the name and a SHA-256 of the stored hash,
so a hash written into the table behind privrelease's back is refused at sign-in and by `audit
verify`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

from accounting import replay, trail
from accounting.errors import InvalidParameterError, TamperError
from accounting.store import Store
from release import keys

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SALT_BYTES, HASH_BYTES = 16, 32
MIN_PASSWORD_LENGTH = 8
# 128 * n * r bytes of memory; OpenSSL's default 32 MiB limit is exactly that for n=2**14, r=8 and
# refuses it.
_MAXMEM = 64 * 1024 * 1024


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=HASH_BYTES
    )


def hash_password(password: str) -> str:
    """A fresh salted scrypt hash of `password` in the stored text format."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt)}${b64(digest)}"


def verify_hash(stored: str | None, password: str) -> bool:
    """True iff `password` matches the stored scrypt hash (constant-time compare)."""
    if not stored or not isinstance(password, str):
        return False
    try:
        scheme, n, r, p, salt_b64, hash_b64 = stored.split("$")
        if scheme != "scrypt":
            return False
        salt, expected = base64.b64decode(salt_b64), base64.b64decode(hash_b64)
        actual = _scrypt(password, salt, int(n), int(r), int(p))
    except (ValueError, TypeError):  # malformed stored hash: never a match
        return False
    return hmac.compare_digest(actual, expected)


def set_password(
    store: Store, name: str, password: str, *, actor: str | None = None
) -> keys.Identity:
    """Set (or replace) the dashboard password of an existing identity; sessions opened with the old
    one end (see session_valid). Raises PrivReleaseError for an unknown identity or a password
    shorter than 8."""
    if not isinstance(password, str) or len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidParameterError(
            f"The password must be at least {MIN_PASSWORD_LENGTH} "
            "characters long; choose a longer one."
        )
    keys.get_identity(store, name)  # UnknownIdentityError (a PrivReleaseError) with a hint
    stored = hash_password(password)
    with store.transaction() as con:
        con.execute("UPDATE identities SET password_hash = ? WHERE name = ?", [stored, name])
        trail.append(
            con,
            store,
            actor or name,
            "identity.password",
            {"name": name, "password_digest": replay.password_digest(stored)},
        )
    return keys.get_identity(store, name)


def check_password(store: Store, name: str, password: str) -> keys.Identity | None:
    """The identity if `name` exists, has a password and `password` matches it; otherwise None.
    Unknown names cost the same scrypt work, so timing does not reveal which names exist."""
    rows = store.query("SELECT password_hash FROM identities WHERE name = ?", [name])
    stored = rows[0]["password_hash"] if rows else None
    if stored is None:
        verify_hash(_DUMMY_HASH, password or "")
        return None
    return keys.get_identity(store, name) if verify_hash(stored, password) else None


_DUMMY_HASH = hash_password(secrets.token_hex(16))

# Sign-in throttling: after MAX_FAILURES failed attempts in a row for one name, that name is locked
# for LOCKOUT_SECONDS (a locked attempt is refused unchecked and does not extend the lock). Attempts
# are audit-trail entries, so the count survives restarts and is shared by every dashboard process
# on the workspace.
MAX_FAILURES = 5
LOCKOUT_SECONDS = 300
SIGN_IN_ACTIONS = ("auth.sign_in", "auth.sign_in_failed")


@dataclass(frozen=True)
class SignIn:
    identity: keys.Identity | None
    message: str = ""  # why it failed, for the person signing in
    session_epoch: str = ""  # binds the session to the password it was opened with


def password_epoch(identity: keys.Identity) -> str:
    """Changes whenever the password does: a session opened under an older password is no longer
    valid."""
    return hashlib.sha256((identity.password_hash or "").encode()).hexdigest()[:32]


def session_valid(store: Store, name: str, epoch: str) -> keys.Identity | None:
    """The identity if it still exists and its password is the one the session was opened with."""
    try:
        ident = keys.get_identity(store, name)
    except keys.UnknownIdentityError:
        return None
    return (
        ident if ident.password_hash and hmac.compare_digest(password_epoch(ident), epoch) else None
    )


def _locked_for(store: Store, name: str, now: float) -> float:
    """Seconds left on `name`'s lockout (0 if not locked)."""
    needle = f'"name":{trail.canonical(name)}'
    rows = store.query(
        "SELECT action, ts FROM audit_trail WHERE action IN (?, ?) AND position(? IN payload) > "
        f"0 ORDER BY seq DESC LIMIT {MAX_FAILURES}",
        [*SIGN_IN_ACTIONS, needle],
    )
    if len(rows) < MAX_FAILURES or any(r["action"] == "auth.sign_in" for r in rows):
        return 0.0
    last = datetime.fromisoformat(rows[0]["ts"]).timestamp()
    return max(0.0, last + LOCKOUT_SECONDS - now)


def sign_in(store: Store, name: str, password: str, *, now: float | None = None) -> SignIn:
    """Check a dashboard sign-in, throttled per name; every attempt (success, failure, refusal while
    locked) is an audit-trail entry."""
    name = (name or "").strip()[:64]
    now = time.time() if now is None else now
    left = _locked_for(store, name, now)
    if left > 0:
        _record(store, name, "auth.sign_in_refused", "locked")
        return SignIn(
            None,
            f"Too many failed sign-ins for this identity: try again in {int(left // 60) + 1} min.",
        )
    ident = check_password(store, name, password)
    if ident is not None:
        try:
            keys.check_against_trail(store, ident)
        except TamperError:
            _record(store, name, "auth.sign_in_failed", "identity differs from the audit trail")
            return SignIn(
                None,
                "This identity's record in the store is not the one the audit trail recorded; "
                "sign-in refused. Ask an auditor to run `privrelease audit verify`.",
            )
    if ident is None:
        _record(
            store,
            name,
            "auth.sign_in_failed",
            "unknown identity, no password set, or wrong password",
        )
        return SignIn(
            None,
            "Unknown identity or wrong password (or no "
            "password set: `privrelease keys password NAME`).",
        )
    _record(store, name, "auth.sign_in", "ok")
    return SignIn(ident, "", password_epoch(ident))


def _record(store: Store, name: str, action: str, result: str) -> None:
    with store.transaction() as con:
        trail.append(
            con, store, name or "-", action, {"name": name, "result": result, "via": "dashboard"}
        )
