"""The workspace and its DuckDB store.

DuckDB allows one writing process per file, so every access (reads too: a read-only open is refused
while another process holds the file for writing) goes through `Store.transaction()`, which holds
an exclusive file lock for the few milliseconds it needs. Several CLI processes can then run at
once safely, and each transaction is all-or-nothing.
"""
from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
from filelock import FileLock

from accounting.errors import PrivReleaseError

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    dataset_id VARCHAR PRIMARY KEY, name VARCHAR UNIQUE NOT NULL, source VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL, record_count BIGINT NOT NULL, labels VARCHAR NOT NULL,
    image_shape VARCHAR NOT NULL, privacy_unit VARCHAR NOT NULL, epsilon_cap DOUBLE NOT NULL,
    delta_cap DOUBLE NOT NULL, registered_at VARCHAR NOT NULL, registered_by VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    position BIGINT PRIMARY KEY, run_id VARCHAR UNIQUE NOT NULL, dataset_id VARCHAR NOT NULL,
    state VARCHAR NOT NULL, planned_events VARCHAR NOT NULL, charged_events VARCHAR NOT NULL,
    description VARCHAR NOT NULL, actor VARCHAR NOT NULL, reserved_at VARCHAR NOT NULL, settled_at VARCHAR);
CREATE TABLE IF NOT EXISTS audit_trail (
    seq BIGINT PRIMARY KEY, ts VARCHAR NOT NULL, actor VARCHAR NOT NULL, action VARCHAR NOT NULL,
    payload VARCHAR NOT NULL, prev_hash VARCHAR NOT NULL, entry_hash VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS identities (
    name VARCHAR PRIMARY KEY, role VARCHAR NOT NULL, public_key VARCHAR NOT NULL,
    password_hash VARCHAR, created_at VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    release_id VARCHAR PRIMARY KEY, dataset_id VARCHAR NOT NULL, mechanism VARCHAR NOT NULL,
    state VARCHAR NOT NULL, spec VARCHAR NOT NULL, plan VARCHAR NOT NULL, plan_digest VARCHAR NOT NULL,
    created_by VARCHAR NOT NULL, created_at VARCHAR NOT NULL, updated_at VARCHAR NOT NULL,
    reason VARCHAR, result VARCHAR);
CREATE TABLE IF NOT EXISTS approvals (
    release_id VARCHAR NOT NULL, approver VARCHAR NOT NULL, decision VARCHAR NOT NULL,
    plan_digest VARCHAR NOT NULL, signature VARCHAR NOT NULL, reason VARCHAR, decided_at VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS audit_results (
    release_id VARCHAR NOT NULL, check_name VARCHAR NOT NULL, passed BOOLEAN,
    summary VARCHAR NOT NULL, details VARCHAR NOT NULL, checked_at VARCHAR NOT NULL,
    PRIMARY KEY (release_id, check_name));
"""


def default_workspace() -> Path:
    return Path(os.environ.get("PRIVRELEASE_HOME", ".privrelease"))


class Workspace:
    """Directory layout of one workspace (ARCHITECTURE.md, Storage)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_workspace()

    db_path = property(lambda self: self.root / "store.duckdb")
    lock_path = property(lambda self: self.root / "store.lock")
    artifacts = property(lambda self: self.root / "artifacts")
    keys = property(lambda self: self.root / "keys")
    bundles = property(lambda self: self.root / "bundles")
    trail_head_path = property(lambda self: self.root / "trail.head")
    hmac_key_path = property(lambda self: self.root / "keys" / "fingerprint.key")

    @property
    def initialised(self) -> bool:
        return self.db_path.exists() and self.hmac_key_path.exists()

    def init(self) -> bool:
        """Create the workspace if needed; returns True if it was created now. Idempotent."""
        created = not self.initialised
        for d in (self.root, self.artifacts, self.keys, self.bundles):
            d.mkdir(parents=True, exist_ok=True)
            # The workspace holds sensitive data's derivatives (models, samples, reports) and the HMAC
            # key: only its owner may enter any of it (README, "Trust model").
            os.chmod(d, 0o700)
        if not self.hmac_key_path.exists():
            # Secret key for dataset/record fingerprints (ARCHITECTURE.md rule 4): a plain hash of sensitive
            # data would let anyone tell D from a neighbouring D'.
            fd = os.open(self.hmac_key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
        store = Store(self, _allow_uninitialised=True)
        with store.transaction() as con:
            con.execute(SCHEMA)
            con.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        for path in (self.db_path, self.db_path.with_name(self.db_path.name + ".wal"), self.lock_path):
            if path.exists():
                os.chmod(path, 0o600)
        return created

    def hmac_key(self) -> bytes:
        return self.hmac_key_path.read_bytes()


class Store:
    """All reads and writes of store.duckdb, serialised by a file lock."""

    def __init__(self, workspace: Workspace | str | os.PathLike | None = None, *, _allow_uninitialised: bool = False):
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        if not _allow_uninitialised and not self.workspace.initialised:
            raise PrivReleaseError(
                f"No privrelease workspace at {self.workspace.root}. Run `privrelease init` "
                "(or pass --workspace / set PRIVRELEASE_HOME to an existing one)."
            )
        # Everything this process writes from now on (models, samples, reports, audit plots of real
        # images, bundles) is its owner's only: files 0600, folders 0700 (README, "Trust model").
        os.umask(os.umask(0o077) | 0o077)
        self._lock = FileLock(str(self.workspace.lock_path), timeout=120, mode=0o600)
        self.before_commit: list = []
        self.after_commit: list = []

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One atomic unit of work: commits on success, rolls back on any exception."""
        with self._lock:
            self.before_commit, self.after_commit = [], []
            con = duckdb.connect(str(self.workspace.db_path))
            try:
                con.execute("BEGIN TRANSACTION")
                try:
                    yield con
                    for action in self.before_commit:  # e.g. the trail's write-ahead head record
                        action()
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
                con.execute("COMMIT")
            finally:
                con.close()
            for action in self.after_commit:  # e.g. recording the trail head, only once committed
                action()

    def query(self, sql: str, params: list | None = None) -> list[dict]:
        """Read rows as dicts (under the lock, like everything else)."""
        with self.transaction() as con:
            cur = con.execute(sql, params or [])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]
