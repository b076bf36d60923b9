"""A refused command leaves the store byte for byte as it was (issue 42: `budget plan --delta 0.1`
and `release plan` of a spec with epsilon = nan used to write pld_cache and rdp_curves rows, caches
derived from the ledger, before refusing)."""

from __future__ import annotations

import hashlib

import pytest
from typer.testing import CliRunner

from accounting import ledger
from accounting.errors import PrivReleaseError
from accounting.events import DpSgd
from accounting.store import Store, Workspace
from release import keys
from release.cli import app


@pytest.fixture
def ws(tmp_path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    keys.create_identity(store, "alice", "steward")
    ledger.register_dataset(
        store,
        name="mnist",
        source="builtin:mnist5k",
        fingerprint="f",
        record_count=4000,
        labels=list(range(10)),
        image_shape=[28, 28],
        epsilon_cap=10.0,
        delta_cap=1e-5,
    )
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "run-1")
    ledger.commit(store, "run-1", [DpSgd(0.01, 1.0, 100)])
    return ws


def _state(ws: Workspace) -> tuple[str, list[str]]:
    """The store file's bytes (closed first: nothing of this process holds it) and the store's files
    (a DuckDB write-ahead log would show there)."""
    Store(ws).backend.release()
    digest = hashlib.sha256(ws.db_path.read_bytes()).hexdigest()
    return digest, sorted(p.name for p in ws.root.glob("store.*"))


def _refused(ws: Workspace, *args: str) -> None:
    r = CliRunner().invoke(app, ["--workspace", str(ws.root), *args])
    assert r.exit_code != 0 and isinstance(r.exception, PrivReleaseError), r.output


def test_budget_plan_refused_for_its_delta_writes_nothing(ws):
    before = _state(ws)
    _refused(ws, "budget", "plan", "--sample-rate", "0.01", "--steps", "100", "--sigma", "1.0")
    _refused(
        ws, "budget", "plan", "--sample-rate", "0.01", "--steps", "100", "--sigma", "1.0",
        "--dataset", "mnist", "--delta", "0.1",
    )  # fmt: skip
    assert _state(ws) == before


def test_release_plan_refused_for_a_nan_epsilon_writes_nothing(ws, tmp_path):
    spec = tmp_path / "nan.toml"
    spec.write_text(
        '[release]\ndataset = "mnist"\nmechanism = "privimage"\nn_images = 20\n'
        '[privimage]\npublic = "builtin:uci-digits"\nepsilon = nan\npreset = "tiny"\n'
    )
    before = _state(ws)
    _refused(ws, "release", "plan", str(spec), "--as", "alice")
    assert _state(ws) == before


def test_reading_the_budget_writes_nothing_and_the_next_charge_still_counts(ws):
    """Reads compute the curve and PLD without writing the store (PLD is cached in a workspace
    file); the charge after them sees the right spend."""
    before = _state(ws)
    store = Store(ws)
    first = ledger.budget(store, "mnist")
    assert ledger.budget(store, "mnist").spent == first.spent  # the second read is cached
    assert _state(ws) == before
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "run-2")
    after = ledger.budget(store, "mnist")
    assert after.spent.epsilon_rdp > first.spent.epsilon_rdp
    assert after.spent.epsilon_pld > first.spent.epsilon_pld
