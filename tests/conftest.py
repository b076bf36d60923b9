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
