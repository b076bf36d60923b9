import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# Runs set torch's thread count from the free cores (release/threads.py); tests keep the one thread they set.
os.environ.setdefault("PRIVRELEASE_THREADS", "1")
# One compute thread per test process, set before numpy, scipy or torch load their pools: `make test` runs a
# worker per core, and OpenBLAS' and OpenMP's thread per core in each worker only wait on one another (the k-SALSA
# estimate test took 29 s instead of 3.6 s). Subprocesses (CLI runs, torchrun workers) inherit it.
for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

from accounting.store import Store, Workspace  # noqa: E402


def _pg_bin() -> Path:
    """The newest Debian-installed PostgreSQL server's bin folder (or PRIVRELEASE_PG_BIN)."""
    if os.environ.get("PRIVRELEASE_PG_BIN"):
        return Path(os.environ["PRIVRELEASE_PG_BIN"])
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()
# Test modules whose store-using tests run against both backends (the ledger suite).
BOTH_BACKENDS = {
    "test_ledger",
    "test_concurrency",
    "test_trail",
    "test_integrity",
    "test_store_postgres",
}


def pytest_generate_tests(metafunc):
    if (
        "store_backend" in metafunc.fixturenames
        and metafunc.module.__name__.rsplit(".", 1)[-1] in BOTH_BACKENDS
    ):
        metafunc.parametrize("store_backend", ["duckdb", "postgresql"], indirect=True)


class PostgresServer:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl) on a free localhost port, trust authentication."""

    def __init__(self, root: Path) -> None:
        self.root, self.data = root, root / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.user = "postgres"

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        # postgres refuses to run as root: run the server binaries as the `postgres` system user then.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        else:
            self.user = os.environ.get("USER") or "postgres"
        r = self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "-A",
            "trust",
            "-E",
            "UTF8",
        )
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-300:]}")
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        r = self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        if r.returncode:
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()[-300:]}")

    def stop(self) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as con:
            con.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL 15 server for the session; tests that need it skip with the reason if it cannot start."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(
            f"PostgreSQL server binaries not found in {PG_BIN} (Debian package `postgresql`; .ci/run "
            "installs it, or set PRIVRELEASE_PG_BIN)"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'psycopg[binary]')")
    root = Path(tempfile.mkdtemp(prefix="privrelease-pg-"))
    os.chmod(root, 0o755)
    server = PostgresServer(root)
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"PostgreSQL could not start: {e}")
    yield server
    server.stop()
    time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def store_backend(request) -> str:
    """Which backend the workspace's store uses: DuckDB unless the module runs on both (BOTH_BACKENDS)."""
    return getattr(request, "param", "duckdb")


@pytest.fixture
def workspace(tmp_path, store_backend, request) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    if store_backend == "postgresql":
        ws.init(store_url=request.getfixturevalue("pg_server").new_database())
    else:
        ws.init()
    return ws


@pytest.fixture
def store(workspace) -> Store:
    return Store(workspace)


@pytest.fixture
def tamper():
    """Edit a workspace's store behind privrelease's back (an attacker with file or database access). Given
    the path of store.duckdb, it edits the database the workspace's store really is (DuckDB or PostgreSQL)."""
    import duckdb

    def run(db_path, *sql: str) -> None:
        url = Workspace(Path(db_path).parent).store_url
        if url:
            import psycopg

            with psycopg.connect(url, autocommit=True) as con:
                for statement in sql:
                    con.execute(statement)
            return
        con = duckdb.connect(str(db_path))
        try:
            for statement in sql:
                con.execute(statement)
        finally:
            con.close()

    return run


@pytest.fixture(scope="session")
def head_atlas_cache(tmp_path_factory) -> Path:
    """One cache of the public head atlases for the whole run, every xdist worker's (building them
    registers the pydeface head to Colin27: seconds each time a fresh cache folder is used; the
    cache is written atomically, so workers may race)."""
    return tmp_path_factory.getbasetemp().parent / "head-atlas-cache"
