import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from accounting.store import Store, Workspace  # noqa: E402


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    return ws


@pytest.fixture
def store(workspace) -> Store:
    return Store(workspace)


@pytest.fixture
def tamper():
    """Edit a workspace's store.duckdb behind privrelease's back (an attacker with file access)."""
    import duckdb

    def run(db_path, *sql: str) -> None:
        con = duckdb.connect(str(db_path))
        try:
            for statement in sql:
                con.execute(statement)
        finally:
            con.close()

    return run
