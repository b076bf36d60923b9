"""The workspace and its store: an embedded DuckDB file (default) or a shared PostgreSQL database.

DuckDB allows one process per file, so every access (reads too: a read-only open is refused while
another process holds the file for writing) goes through `Store.transaction()`, under an exclusive
file lock. A process keeps the connection and the lock across a burst of transactions and lets go at
once when another process waits (and lets it go first: store_backends.HANDOFF_S), or after a short
idle time (store_backends.HOLD_IDLE_S), so several
CLI processes can run at once safely and a charge does not pay connect + checkpoint each time. With
PostgreSQL (`privrelease init --store postgresql://...`), transactions of every host are serialised
by an advisory lock (store_backends.PostgresBackend). Each transaction is all-or-nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomli_w

from accounting.errors import PrivReleaseError
from accounting.store_backends import DuckDBBackend, PostgresBackend, is_postgres_url, redact

SCHEMA_VERSION = 1
# The running RDP curve of each dataset (accounting/curve.py), written with every charge.
RDP_CURVES_TABLE = """CREATE TABLE IF NOT EXISTS rdp_curves (
    dataset_id VARCHAR PRIMARY KEY, rdp VARCHAR NOT NULL, non_private BIGINT NOT NULL,
    events BIGINT NOT NULL,
    orders VARCHAR NOT NULL)"""
SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    dataset_id VARCHAR PRIMARY KEY, name VARCHAR UNIQUE NOT NULL, source VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL, record_count BIGINT NOT NULL, labels VARCHAR NOT NULL,
    image_shape VARCHAR NOT NULL, privacy_unit VARCHAR NOT NULL, epsilon_cap DOUBLE NOT NULL,
    delta_cap DOUBLE NOT NULL, registered_at VARCHAR NOT NULL, registered_by VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    position BIGINT PRIMARY KEY, run_id VARCHAR UNIQUE NOT NULL, dataset_id VARCHAR NOT NULL,
    state VARCHAR NOT NULL, planned_events VARCHAR NOT NULL, charged_events VARCHAR NOT NULL,
    description VARCHAR NOT NULL, actor VARCHAR NOT NULL, reserved_at VARCHAR NOT NULL,
    settled_at VARCHAR);
CREATE TABLE IF NOT EXISTS audit_trail (
    seq BIGINT PRIMARY KEY, ts VARCHAR NOT NULL, actor VARCHAR NOT NULL, action VARCHAR NOT NULL,
    payload VARCHAR NOT NULL, prev_hash VARCHAR NOT NULL, entry_hash VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS identities (
    name VARCHAR PRIMARY KEY, role VARCHAR NOT NULL, public_key VARCHAR NOT NULL,
    password_hash VARCHAR, created_at VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    release_id VARCHAR PRIMARY KEY, dataset_id VARCHAR NOT NULL, mechanism VARCHAR NOT NULL,
    state VARCHAR NOT NULL, spec VARCHAR NOT NULL, plan VARCHAR NOT NULL,
    plan_digest VARCHAR NOT NULL,
    created_by VARCHAR NOT NULL, created_at VARCHAR NOT NULL, updated_at VARCHAR NOT NULL,
    reason VARCHAR, result VARCHAR);
CREATE TABLE IF NOT EXISTS approvals (
    release_id VARCHAR NOT NULL, approver VARCHAR NOT NULL, decision VARCHAR NOT NULL,
    plan_digest VARCHAR NOT NULL, signature VARCHAR NOT NULL, reason VARCHAR,
    decided_at VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS audit_results (
    release_id VARCHAR NOT NULL, check_name VARCHAR NOT NULL, passed BOOLEAN,
    summary VARCHAR NOT NULL, details VARCHAR NOT NULL, checked_at VARCHAR NOT NULL,
    PRIMARY KEY (release_id, check_name));
"""
    + RDP_CURVES_TABLE
    + ";\n"
)


def default_workspace() -> Path:
    return Path(os.environ.get("PRIVRELEASE_HOME", ".privrelease"))


class Workspace:
    """Directory layout of one workspace (ARCHITECTURE.md, Storage)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_workspace()

    db_path = property(lambda self: self.root / "store.duckdb")
    config_path = property(lambda self: self.root / "config.toml")
    lock_path = property(lambda self: self.root / "store.lock")
    # this host's writers, PostgreSQL store
    pg_lock_path = property(lambda self: self.root / "store-pg.lock")
    artifacts = property(lambda self: self.root / "artifacts")
    keys = property(lambda self: self.root / "keys")
    bundles = property(lambda self: self.root / "bundles")
    # derived figures that take seconds to recompute (PLD epsilon), keyed by what they derive from
    ledger_cache = property(lambda self: self.root / "cache" / "ledger")
    trail_head_path = property(lambda self: self.root / "trail.head")
    hmac_key_path = property(lambda self: self.root / "keys" / "fingerprint.key")

    @property
    def store_url(self) -> str | None:
        """The PostgreSQL URL the workspace's store lives at, or None for the local DuckDB file."""
        try:
            config = tomllib.loads(self.config_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise PrivReleaseError(
                f"{self.config_path} is unreadable ({e}). It holds the shared store's URL: fix its "
                '[store] url = "postgresql://..." line, or remove the file to use the '
                "workspace's own store.duckdb."
            ) from None
        return config.get("store", {}).get("url") or None

    def set_store_url(self, url: str | None) -> None:
        """Point the workspace at a PostgreSQL store (None: back to store.duckdb). The file is 0600:
        the URL may hold a password."""
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            tomli_w.dump({"store": {"url": url}} if url else {}, f)

    @property
    def initialised(self) -> bool:
        store_there = self.store_url is not None or self.db_path.exists()
        return store_there and self.hmac_key_path.exists()

    def init(self, store_url: str | None = None) -> bool:
        """Create the workspace if needed; returns True if it was created now. Idempotent.
        `store_url` (postgresql://...) keeps the tables in that database instead of store.duckdb."""
        if store_url is not None:
            check_store_url(store_url)
            if self.initialised and self.store_url != store_url:
                raise PrivReleaseError(
                    f"The workspace at {self.root} already has its store "
                    f"({redact(self.store_url or str(self.db_path))}). To move it to PostgreSQL "
                    "use `privrelease store migrate --to URL`."
                )
        created = not self.initialised
        for d in (self.root, self.artifacts, self.keys, self.bundles):
            d.mkdir(parents=True, exist_ok=True)
            # The workspace holds sensitive data's derivatives (models, samples, reports) and the
            # HMAC key: only its owner may enter any of it (README, "Trust model").
            os.chmod(d, 0o700)
        if not self.hmac_key_path.exists():
            # Secret key for dataset/record fingerprints (ARCHITECTURE.md rule 4): a plain hash of
            # sensitive data would let anyone tell D from a neighbouring D'.
            fd = os.open(self.hmac_key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
        previous = self.store_url
        if store_url is not None:
            self.set_store_url(store_url)
        try:
            store = Store(self, _allow_uninitialised=True)
            create_schema(store)
            if store.shared:
                check_fingerprint_key(self, store)
        except PrivReleaseError:
            self.set_store_url(previous)  # not left pointing at a store it could not use
            raise
        for path in (
            self.db_path,
            self.db_path.with_name(self.db_path.name + ".wal"),
            self.lock_path,
        ):
            if path.exists():
                os.chmod(path, 0o600)
        return created

    def hmac_key(self) -> bytes:
        return self.hmac_key_path.read_bytes()


def check_store_url(url: str) -> None:
    if not is_postgres_url(url):
        raise PrivReleaseError(
            "--store takes a PostgreSQL URL (postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE), "
            f"not {redact(url)!r}; without --store the workspace uses its own store.duckdb."
        )


def create_schema(store: Store) -> None:
    with store.transaction() as con:
        con.execute(SCHEMA)
        con.execute(
            "INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT DO NOTHING",
            [str(SCHEMA_VERSION)],
        )


def check_fingerprint_key(ws: Workspace, store: Store) -> None:
    """Every workspace sharing a store must fingerprint with the same HMAC key: a dataset registered
    on one host is re-checked against its fingerprint when a release on another host reads it. The
    store keeps an HMAC of a constant under the key (not the key) and refuses a workspace whose key
    differs."""
    key_id = hmac.new(ws.hmac_key(), b"privrelease fingerprint key id", hashlib.sha256).hexdigest()[
        :32
    ]
    with store.transaction() as con:
        con.execute(
            "INSERT INTO meta VALUES ('fingerprint_key_id', ?) ON CONFLICT DO NOTHING", [key_id]
        )
        stored = con.execute("SELECT value FROM meta WHERE key = 'fingerprint_key_id'").fetchone()[
            0
        ]
    if stored != key_id:
        raise PrivReleaseError(
            f"The store {redact(ws.store_url or '')} is used by workspaces with another "
            "fingerprint key. Copy keys/fingerprint.key from a workspace that uses this store to "
            f"{ws.hmac_key_path} (mode 0600) and run `privrelease init --store URL` again."
        )


class Store:
    """All reads and writes of the workspace's tables, one serialised transaction at a time."""

    # set by accounting.trail during a transaction: the head it will create, and whose hooks record
    # it
    _trail_new_head: tuple[int, str]
    _trail_hooks_of: Any

    def __init__(
        self,
        workspace: Workspace | str | os.PathLike | None = None,
        *,
        _allow_uninitialised: bool = False,
    ):
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        if not _allow_uninitialised and not self.workspace.initialised:
            raise PrivReleaseError(
                f"No privrelease workspace at {self.workspace.root}. Run `privrelease init` (or "
                "pass --workspace / set PRIVRELEASE_HOME to an existing one)."
            )
        # Everything this process writes from now on (models, samples, reports, audit plots of real
        # images, bundles) is its owner's only: files 0600, folders 0700 (README, "Trust model").
        os.umask(os.umask(0o077) | 0o077)
        url = self.workspace.store_url
        self.backend = (
            PostgresBackend(url, self.workspace.pg_lock_path)
            if url
            else DuckDBBackend(self.workspace.db_path, self.workspace.lock_path)
        )
        self.before_commit: list = []
        self.after_commit: list = []

    @property
    def _lock(self) -> Any:
        """Held: no transaction of this host runs (reads that must see the rows and the head files
        together)."""
        return self.backend.locked()

    @property
    def shared(self) -> bool:
        """True when other workspaces (hosts) may write the same store (PostgreSQL)."""
        return self.backend.shared

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One atomic unit of work: commits on success, rolls back on any exception."""
        with self.backend.transaction(self._before_commit, self._after_commit) as con:
            self.before_commit, self.after_commit = [], []
            yield con

    def _before_commit(self) -> None:
        for action in self.before_commit:  # e.g. the trail's write-ahead head record
            action()

    def _after_commit(self) -> None:
        for action in self.after_commit:  # e.g. recording the trail head, only once committed
            action()

    def query(self, sql: str, params: list | None = None) -> list[dict]:
        """Read rows as dicts (under the lock, like everything else)."""
        with self.transaction() as con:
            cur = con.execute(sql, params or [])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
