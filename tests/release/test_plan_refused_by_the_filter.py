"""A plan the cap's privacy filter will refuse is refused at plan time (issue 57, item 9): a merf
release to epsilon 10 on a cap of 10 used to be stored and approved, and only `release run`
refused it, so a steward approved something that could never run."""

from __future__ import annotations

import hashlib
import re

import pytest

from accounting import ledger
from accounting.errors import BudgetExceededError
from accounting.store import Store, Workspace
from release import keys, manager, planning
from release.data import register_from_source
from release.spec import ReleaseSpec


@pytest.fixture
def store(tmp_path) -> Store:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    st = Store(ws)
    keys.create_identity(st, "alice", "steward")
    register_from_source(st, "mnist", "builtin:mnist5k", 10.0, 1e-5)
    return st


def _spec(epsilon: float) -> ReleaseSpec:
    return ReleaseSpec.from_dict(
        {
            "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 100},
            "merf": {"epsilon": epsilon, "steps": 5, "n_features": 256},
        }
    )


def _state(store: Store) -> str:
    store.backend.release()
    return hashlib.sha256(store.workspace.db_path.read_bytes()).hexdigest()


# Slow since issue 63 (end to end: a whole bisection of merf calibrations; fast: tests/release/tes
# t_release_plan.py::test_the_fitting_target_search_survives_targets_below_the_prior_spend,
# tests/accounting/test_largest_target.py)
@pytest.mark.slow
def test_a_plan_at_the_cap_is_refused_with_the_largest_target_that_fits(store) -> None:
    before = _state(store)
    with pytest.raises(BudgetExceededError) as refused:
        manager.create_plan(store, _spec(10.0), "alice")
    message = str(refused.value)
    assert message.startswith("Nothing was planned or stored.")
    assert "privacy filter would stop this release" in message and "cap 10" in message
    found = re.search(r"largest target that fits is about epsilon = ([0-9.]+)", message)
    assert found and "in the spec's [merf] table" in message, message
    assert _state(store) == before and manager.list_releases(store) == []
    # the what-if preview still shows it as a warning (it stores nothing either way)
    assert any(
        "its plan will be refused" in w for w in planning.preview(store, _spec(10.0))["warnings"]
    )
    # the target it names plans, is approved and is admitted by the ledger's own reserve rule
    suggested = float(found.group(1))
    rel = manager.create_plan(store, _spec(suggested), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    events = list(rel.plan.mechanism_view().events)
    ledger.reserve(store, "mnist", events, "probe", description="admitted")
    ledger.refund(store, "probe", reason="only a probe of the filter")
