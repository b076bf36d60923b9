"""Identities (steward, auditor, consumer) and Ed25519 keys, including the platform's release key.

Private keys live in `workspace.keys` as `<name>.key` (PEM PKCS8, mode 0600, created with O_EXCL so
they are never readable by others, not even briefly) beside `<name>.pub` (PEM). The identity's raw
public key is also stored (base64) in the store's `identities` table, so approvals can be checked
from the store alone. The release key (`release.key` / `release.pub`) is the platform's, not a
person's: it signs bundles and is not an identity.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from filelock import FileLock

from accounting import replay, trail
from accounting.errors import (
    DatasetConflictError,
    PermissionDeniedError,
    PrivReleaseError,
    TamperError,
)
from accounting.store import Store, Workspace

# Public-key parsing lives in a module light enough for `privrelease verify` to start fast.
from release.pubkey import (  # noqa: F401
    KeyFileError,
    PublicKeyLike,
    key_id,
    load_public_key,
    raw_public_bytes,
    verify_signature,
)

ROLES = ("steward", "auditor", "consumer")
RELEASE_KEY = "release"
# Names that would collide with platform files in keys/ (fingerprint.key is the HMAC secret).
RESERVED_NAMES = frozenset({RELEASE_KEY, "fingerprint", "system", "platform"})


class UnknownIdentityError(PrivReleaseError, KeyError):
    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else "unknown identity"


@dataclass(frozen=True)
class Identity:
    name: str
    role: str
    public_key: str  # raw 32-byte Ed25519 public key, base64
    created_at: str
    password_hash: str | None = None

    @property
    def public_key_bytes(self) -> bytes:
        return base64.b64decode(self.public_key)

    @property
    def key_id(self) -> str:
        """sha256 (hex) of the raw public key: the DSSE keyid."""
        return hashlib.sha256(self.public_key_bytes).hexdigest()

    def public_key_object(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.public_key_bytes)


def private_key_path(workspace: Workspace, name: str) -> Path:
    return workspace.keys / f"{name}.key"


def public_key_path(workspace: Workspace, name: str) -> Path:
    return workspace.keys / f"{name}.pub"


def _check_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not name
        or len(name) > 64
        or name.startswith(".")
        or not name.replace("-", "").replace("_", "").replace(".", "").isalnum()
        or not name.isascii()
    ):
        raise PrivReleaseError(
            f"Identity name {name!r} is not usable: use 1-64 ASCII letters, digits, '-', '_' or "
            "'.', not starting with '.'."
        )
    if name.lower() in RESERVED_NAMES:
        raise PrivReleaseError(
            f"Identity name {name!r} is reserved for the platform; choose another name."
        )
    return name


def _check_role(role: object) -> str:
    if not isinstance(role, str) or role not in ROLES:
        raise PrivReleaseError(f"Unknown role {role!r}: choose one of {', '.join(ROLES)}.")
    return role


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with `mode` from the start (O_EXCL: never replaces an existing file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits we want (never adds any)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        if fd >= 0:
            os.close(fd)


def _write_keypair(workspace: Workspace, name: str) -> tuple[Ed25519PrivateKey, list[Path]]:
    """Generate a key and write `<name>.key` (0600) and `<name>.pub`; returns the key and files
    written."""
    workspace.keys.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    written: list[Path] = []
    try:
        for path, data, mode in (
            (private_key_path(workspace, name), priv_pem, 0o600),
            (public_key_path(workspace, name), pub_pem, 0o644),
        ):
            try:
                _write_exclusive(path, data, mode)
            except FileExistsError:
                raise KeyFileError(
                    f"Key file {path} already exists but no identity {name!r} "
                    "is registered (left over from an interrupted run, or "
                    "created by hand). Move it away or choose another name."
                ) from None
            written.append(path)
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        raise
    return key, written


def create_identity(
    store: Store, name: str, role: str, *, actor: str = "system", endorser: str | None = None
) -> Identity:
    """Create an identity with a fresh Ed25519 key; refuses a duplicate name or an unknown role.
    Once a steward exists, a new steward needs `endorser`: an existing steward, proven by their
    private key, whose signature over the new identity is recorded in the trail (the first one is
    made at init)."""
    name, role = _check_name(name), _check_role(role)
    ws = store.workspace
    endorsing = authenticate(store, endorser, "steward") if endorser is not None else None
    written: list[Path] = []
    try:
        with store.transaction() as con:
            if con.execute("SELECT 1 FROM identities WHERE name = ?", [name]).fetchone():
                raise DatasetConflictError(
                    f"An identity named {name!r} already exists; choose another name."
                )
            has_steward = (
                con.execute("SELECT count(*) FROM identities WHERE role = 'steward'").fetchone()[0]
                > 0
            )
            if role == "steward" and has_steward and endorsing is None:
                raise PermissionDeniedError(
                    "Only an existing steward can create another steward: run `privrelease keys "
                    f"create {name} --role steward --as STEWARD` with that steward's private key "
                    "in the workspace's keys/."
                )
            key, written = _write_keypair(ws, name)
            raw = raw_public_bytes(key.public_key())
            public_b64 = base64.b64encode(raw).decode("ascii")
            created_at = trail.now()
            con.execute(
                "INSERT INTO identities VALUES (?, ?, ?, NULL, ?)",
                [name, role, public_b64, created_at],
            )
            payload = {
                "name": name,
                "role": role,
                "public_key": public_b64,
                "key_id": hashlib.sha256(raw).hexdigest(),
            }
            if endorsing is not None:
                message = replay.endorsement_message(name, role, public_b64)
                payload.update(
                    endorsed_by=endorsing.name, endorsement=sign(ws, endorsing.name, message).hex()
                )
            trail.append(con, store, actor, "identity.create", payload)
    except BaseException:
        for p in written:  # the row was rolled back: leave no orphan key files either
            p.unlink(missing_ok=True)
        raise
    return Identity(name, role, public_b64, created_at)


def get_identity(store: Store, name: str) -> Identity:
    rows = store.query(
        "SELECT name, role, public_key, created_at, password_hash FROM identities WHERE name = ?",
        [name],
    )
    if not rows:
        raise UnknownIdentityError(
            f"No identity named {name!r}. Create one with `privrelease keys create {name} --role "
            "ROLE --as STEWARD` or list them with `privrelease keys list`."
        )
    return Identity(**rows[0])


def list_identities(store: Store) -> list[Identity]:
    rows = store.query(
        "SELECT name, role, public_key, created_at, password_hash FROM identities ORDER BY name"
    )
    return [Identity(**r) for r in rows]


def require_role(identity: Identity, *roles: str) -> Identity:
    """Raise PermissionDeniedError unless the identity has one of `roles`."""
    if identity.role not in roles:
        needed = " or ".join(roles)
        raise PermissionDeniedError(
            f"{identity.name!r} is a {identity.role}; this action needs the {needed} role. Act as "
            "an identity with that role."
        )
    return identity


def has_steward(store: Store) -> bool:
    return bool(store.query("SELECT name FROM identities WHERE role = 'steward' LIMIT 1"))


def check_against_trail(store: Store, ident: Identity) -> Identity:
    """The identity as read, if its role, key and password are the ones the audit trail recorded
    for it (the trail's entries for identities, their hashes and stewards' endorsements checked).
    Raises TamperError for an identity inserted or edited behind privrelease's back."""
    with store.transaction() as con:
        problems = replay.identity_problems(con, ident.name)
    if problems:
        raise TamperError(
            f"Identity {ident.name!r} in the store is not what the audit trail recorded ("
            + "; ".join(problems[:2])
            + "): nothing was done. Run `privrelease audit verify`; restore the store from a "
            "backup or a signed checkpoint."
        )
    return ident


def authenticate(store: Store, name: str, *roles: str) -> Identity:
    """The identity `name`, proven by possession of its private key (a name alone is not enough for
    a state-changing action) and checked against the audit trail (role and key as recorded).
    Raises UnknownIdentityError, PermissionDeniedError (wrong role), KeyFileError (key missing,
    unreadable, or not the key registered for `name`) or TamperError (the identity row was edited
    or inserted behind privrelease's back)."""
    ident = check_against_trail(store, get_identity(store, name))
    if roles:
        require_role(ident, *roles)
    try:
        key = load_private_key(store.workspace, name)
    except KeyFileError as e:
        raise KeyFileError(f"Acting as {name!r} needs {name}'s private key: {e}") from None
    # proof of possession: sign, then verify with the registered public key
    challenge = os.urandom(32)
    try:
        ident.public_key_object().verify(key.sign(challenge), challenge)
    except InvalidSignature:
        raise KeyFileError(
            f"The private key at {private_key_path(store.workspace, name)} "
            f"is not the key registered for {name!r}; restore the right "
            "key file (an identity's key cannot be swapped)."
        ) from None
    return ident


def load_private_key(workspace: Workspace, name: str) -> Ed25519PrivateKey:
    path = private_key_path(workspace, name)
    try:
        st = path.stat()
    except FileNotFoundError:
        hint = (
            "it is created by the first signed release"
            if name == RELEASE_KEY
            else (
                "create the identity with `privrelease keys "
                f"create {name} --role ROLE --as STEWARD`"
            )
        )
        raise KeyFileError(f"No private key for {name!r} at {path}: {hint}.") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"Private key {path} is accessible by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod 600 {path}` and, if others may have read it, replace the key."
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise KeyFileError(
            f"Private key {path} could not be read as an unencrypted PEM key ({e})."
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(
            f"Private key {path} is not an Ed25519 key; privrelease signs only with Ed25519."
        )
    return key


def sign(workspace: Workspace, name: str, data: bytes) -> bytes:
    """Ed25519 signature (64 bytes) of `data` with `name`'s private key."""
    return load_private_key(workspace, name).sign(data)


def ensure_release_key(workspace: Workspace) -> Path:
    """Create the platform's release-signing key if needed; returns the path of `release.pub`.
    Idempotent."""
    workspace.keys.mkdir(parents=True, exist_ok=True)
    with FileLock(str(workspace.keys / ".release.lock"), timeout=60):
        priv, pub = (
            private_key_path(workspace, RELEASE_KEY),
            public_key_path(workspace, RELEASE_KEY),
        )
        if not priv.exists():
            pub.unlink(missing_ok=True)  # a .pub without its private key is useless
            _write_keypair(workspace, RELEASE_KEY)
            return pub
        key = load_private_key(workspace, RELEASE_KEY)
        pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        if (
            not pub.exists() or pub.read_bytes() != pem
        ):  # the export is derived: rewrite it if lost or edited
            tmp = pub.with_name(".release.pub.tmp")
            tmp.unlink(missing_ok=True)
            _write_exclusive(tmp, pem, 0o644)
            os.replace(tmp, pub)
        return pub
