"""Where the store's tables live: an embedded DuckDB file (the default) or a shared PostgreSQL
server.

Both backends give `Store.transaction()` the same thing: a connection whose `execute(sql, params)`
takes the DuckDB dialect the code is written in (`?` parameters, `rowid`, `DOUBLE`) and
returns a cursor with `fetchone`, `fetchall` and `description`, inside one all-or-nothing
transaction that no other writer interleaves with.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
from filelock import FileLock, Timeout

from accounting.errors import PrivReleaseError

LOCK_TIMEOUT_S = 120
# A process keeps its DuckDB connection (and the file lock) this long after its last transaction, so
# that a burst of transactions (a reserve and its commit, a page of the dashboard) pays connect +
# checkpoint once. Another process that wants the store leaves a marker and gets it at the end of
# the current transaction.
HOLD_IDLE_S = 0.05
# A process about to take the free lock while another is already waiting for it lets the waiter
# go first, for at most this long: else a busy process re-took the lock between its transactions
# before the waiter's next poll (every 50 ms) saw it free, and the waiter starved (6-34 s measured).
HANDOFF_S = 1.0
Hooks = Callable[[], None]


# ------------------------------------------------------------------ DuckDB
class _DuckHold:
    """This process's open connection to one DuckDB file, and the file lock that must be held while
    it is open (DuckDB refuses a second process while one has the file open)."""

    def __init__(self, db_path: Path, lock_path: Path) -> None:
        self.db_path = db_path
        self.mutex = threading.RLock()  # one transaction at a time in this process
        # thread_local=False: the idle timer's thread releases what a transaction's thread acquired.
        self.lock = FileLock(str(lock_path), timeout=LOCK_TIMEOUT_S, mode=0o600, thread_local=False)
        self.waiting = lock_path.with_name(lock_path.name + ".waiting")
        self.con: duckdb.DuckDBPyConnection | None = None
        self.inode: int | None = None
        self.depth = 0
        self.generation = 0
        self.timer: threading.Timer | None = None

    def acquire_file_lock(self) -> None:
        """Take the file lock (re-entrant); a process already waiting goes first (HANDOFF_S);
        while blocked, leave a marker so the holder lets go soon."""
        if not self.lock.is_locked:
            deadline = time.monotonic() + HANDOFF_S
            while self.someone_waits() and time.monotonic() < deadline:
                time.sleep(0.005)
        try:
            self.lock.acquire(timeout=0)
            return
        except Timeout:
            pass
        self.waiting.mkdir(mode=0o700, exist_ok=True)
        marker = self.waiting / str(os.getpid())
        marker.touch(mode=0o600)
        try:
            self.lock.acquire(timeout=LOCK_TIMEOUT_S)
        finally:
            marker.unlink(missing_ok=True)

    def open(self) -> duckdb.DuckDBPyConnection:
        self.generation += 1  # disarms a pending idle release
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.con is not None and _inode(self.db_path) != self.inode:
            # the file was removed or replaced behind us (a workspace deleted and made again)
            self.close()
        if self.con is None:
            self.acquire_file_lock()
            try:
                self.con = duckdb.connect(str(self.db_path))
                self.inode = _inode(self.db_path)
            except BaseException:
                self.lock.release()
                raise
        return self.con

    def close(self) -> None:
        with self.mutex:
            if self.con is None or self.depth:
                return
            try:
                self.con.close()
            finally:
                self.con = None
                self.lock.release()

    def someone_waits(self) -> bool:
        try:
            names = os.listdir(self.waiting)
        except FileNotFoundError:
            return False
        for name in names:
            if name == str(os.getpid()):
                continue
            if name.isdigit() and _alive(int(name)):
                return True
            # a waiter that died: not waiting any more
            (self.waiting / name).unlink(missing_ok=True)
        return False

    def idle(self) -> None:
        """After the outermost transaction: let go now if another process waits, else after
        HOLD_IDLE_S."""
        if self.con is None:
            return
        if self.someone_waits():
            self.close()
            return
        generation = self.generation
        self.timer = threading.Timer(HOLD_IDLE_S, self._close_if_idle, [generation])
        self.timer.daemon = True
        self.timer.start()

    def _close_if_idle(self, generation: int) -> None:
        with self.mutex:
            if generation == self.generation:
                self.close()


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_HOLDS: dict[str, _DuckHold] = {}
_ORPHANS: list[_DuckHold] = []
_HOLDS_MUTEX = threading.Lock()
_HOOKED = False


def _hold_for(db_path: Path, lock_path: Path) -> _DuckHold:
    global _HOOKED
    key = os.path.realpath(db_path)
    with _HOLDS_MUTEX:
        if (
            not _HOOKED
        ):  # registered on first use, not at import (importing changes no process state)
            os.register_at_fork(after_in_child=_forget_after_fork)
            atexit.register(_close_all)
            _HOOKED = True
        if key not in _HOLDS:
            _HOLDS[key] = _DuckHold(db_path, lock_path)
        return _HOLDS[key]


def _forget_after_fork() -> None:
    """A forked child must not use (or, by garbage collection, close) its parent's connection and
    lock."""
    global _HOLDS_MUTEX
    _ORPHANS.extend(_HOLDS.values())
    _HOLDS.clear()
    _HOLDS_MUTEX = threading.Lock()


def _close_all() -> None:
    for hold in list(_HOLDS.values()):
        hold.generation += 1
        hold.close()


class DuckDBBackend:
    """The embedded default: one file, writers serialised by a file lock on this host."""

    name = "duckdb"
    shared = False

    def __init__(self, db_path: Path, lock_path: Path) -> None:
        self.db_path = db_path
        self._hold = _hold_for(db_path, lock_path)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """No transaction of any process runs while this is held (reads that must see one state)."""
        with self._hold.mutex:
            self._hold.acquire_file_lock()
            try:
                yield
            finally:
                self._hold.lock.release()

    @contextmanager
    def transaction(self, before_commit: Hooks, after_commit: Hooks) -> Iterator[Any]:
        hold = self._hold
        with hold.mutex:
            con = hold.open()
            # A transaction opened inside another (same thread) gets its own connection to the same
            # database.
            cur = con.cursor() if hold.depth else con
            hold.depth += 1
            try:
                yield from _run(cur, before_commit, after_commit)
            except BaseException:
                if hold.depth == 1 and not _usable(con):
                    hold.depth = 0
                    hold.close()
                raise
            finally:
                hold.depth = max(0, hold.depth - 1)
                if cur is not con:
                    cur.close()
                if hold.depth == 0:
                    hold.idle()

    def release(self) -> None:
        """Close the connection and let other processes in now (e.g. before copying the file)."""
        with self._hold.mutex:
            self._hold.generation += 1
            self._hold.close()


def _usable(con: duckdb.DuckDBPyConnection) -> bool:
    try:
        con.execute("SELECT 1").fetchone()
        return True
    except Exception:  # noqa: BLE001 - any failure means: do not reuse it
        return False


def _run(cur: Any, before_commit: Hooks, after_commit: Hooks) -> Iterator[Any]:
    """BEGIN, hand out the connection, run the hooks, COMMIT (ROLLBACK on any exception)."""
    cur.execute("BEGIN TRANSACTION")
    try:
        yield cur
        before_commit()
    except BaseException:
        try:
            cur.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass
        raise
    cur.execute("COMMIT")
    after_commit()


# ------------------------------------------------------------------ PostgreSQL Every store
# transaction takes this transaction-scoped advisory lock first, so transactions of all stewards on
# all hosts run one at a time, as DuckDB's file lock makes them run on one host. Chosen over
# SERIALIZABLE + retry because a transaction body is not safely retryable: it runs Python hooks (the
# trail's write-ahead head file), and its checks (cap vs. running curve, trail head -> seq + 1)
# would make concurrent charges conflict and abort anyway. A ledger sees a few writes a minute; one
# at a time is plenty. READ COMMITTED, not REPEATABLE READ: each statement's snapshot is taken after
# the lock is granted, so it sees everything committed before (a REPEATABLE READ snapshot would
# predate the wait).
ADVISORY_KEY = int.from_bytes(b"privrels", "big") & 0x7FFF_FFFF_FFFF_FFFF


class PostgresBackend:
    """A PostgreSQL database shared by several workspaces (hosts); one connection per process."""

    name = "postgresql"
    shared = True

    def __init__(self, url: str, lock_path: Path) -> None:
        self.url = url
        self._local = FileLock(
            str(lock_path), timeout=LOCK_TIMEOUT_S, mode=0o600, thread_local=False
        )
        self._mutex = threading.RLock()
        self._con: Any = None
        self._pid = os.getpid()
        self._depth = 0

    def _connection(self) -> Any:
        if self._pid != os.getpid():  # forked: the parent's socket is not ours
            self._con, self._pid = None, os.getpid()
        if self._con is None or self._con.closed or self._con.broken:
            self._con = connect_postgres(self.url)
        return self._con

    @contextmanager
    def locked(self) -> Iterator[None]:
        """This host's writers stay out (the local trail head files are read with the rows)."""
        with self._mutex, self._local:
            yield

    @contextmanager
    def transaction(self, before_commit: Hooks, after_commit: Hooks) -> Iterator[Any]:
        with self._mutex, self._local:
            inner = self._depth > 0
            raw = connect_postgres(self.url) if inner else self._connection()
            con = PgConnection(raw)
            self._depth += 1
            try:
                con.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                if not inner:  # an inner transaction's process already holds the lock (outer one)
                    con.execute("SELECT pg_advisory_xact_lock(?)", [ADVISORY_KEY])
                yield from _run_begun(con, before_commit, after_commit)
            finally:
                self._depth -= 1
                if inner:
                    raw.close()

    def release(self) -> None:
        with self._mutex:
            if self._con is not None and not self._depth:
                self._con.close()
                self._con = None


def _run_begun(con: PgConnection, before_commit: Hooks, after_commit: Hooks) -> Iterator[Any]:
    try:
        yield con
        before_commit()
    except BaseException:
        if not con.raw.closed:
            try:
                con.raw.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        raise
    con.raw.execute("COMMIT")
    after_commit()


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def connect_postgres(url: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PrivReleaseError(
            f"Cannot reach the PostgreSQL store {redact(url)}: {first}. Check that the server runs "
            "and accepts this user (its password from ~/.pgpass or PGPASSWORD), and the URL given "
            "to `privrelease init --store`."
        ) from None


_PARAM_OR_QUOTED = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|\?|%")
_ROWID = re.compile(r"\browid\b", re.IGNORECASE)
_DOUBLE = re.compile(r"\bDOUBLE\b(?!\s+PRECISION)", re.IGNORECASE)


def to_postgres(sql: str, has_params: bool) -> str:
    """DuckDB dialect -> PostgreSQL: `?` -> `%s` (and a literal `%` -> `%%` when psycopg parses
    parameters), `rowid` -> `ctid` (storage order; on PostgreSQL not the order rows were written),
    `DOUBLE` -> `DOUBLE PRECISION`. Quoted text is left alone."""

    def sub(m: re.Match) -> str:
        tok = m.group(0)
        if tok == "?":
            return "%s"
        if tok == "%":
            return "%%" if has_params else "%"
        return tok

    sql = _PARAM_OR_QUOTED.sub(sub, sql)
    return _DOUBLE.sub("DOUBLE PRECISION", _ROWID.sub("ctid", sql))


class PgConnection:
    """psycopg connection speaking the store's (DuckDB) dialect."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, params: list | tuple | None = None) -> Any:
        params = list(params) if params else None
        return self.raw.execute(to_postgres(sql, params is not None), params)


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))
