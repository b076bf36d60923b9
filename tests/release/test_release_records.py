"""The typed release record: what the manager returns, what the CLI prints, what a tampered row
gives."""

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from accounting.errors import TamperError
from release import keys, manager
from release.cli import app
from release.data import register_from_source
from release.records import STATES, Release
from release.spec import Plan, ReleaseSpec

KSALSA = {
    "release": {"dataset": "mnist", "mechanism": "ksalsa"},
    "ksalsa": {"k": 5, "preset": "tiny"},
}


@pytest.fixture
def planned(store):
    keys.create_identity(store, "alice", "steward")
    register_from_source(store, "mnist", "builtin:mnist5k", 10.0, 1e-5)
    return manager.create_plan(store, ReleaseSpec.from_dict(KSALSA), "alice")


def _raw(store, release_id: str) -> dict:
    """The stored row with its JSON columns decoded: what the manager returned before it was
    typed."""
    row = store.query("SELECT * FROM releases WHERE release_id = ?", [release_id])[0]
    return {
        k: (json.loads(v) if k in ("spec", "plan", "result") and v else v) for k, v in row.items()
    }


def test_release_is_typed_and_frozen(store, planned):
    assert isinstance(planned, Release) and isinstance(planned.plan, Plan)
    assert (
        planned.state == "planned" and planned.plan.mechanism == "ksalsa" and planned.result is None
    )
    assert (
        planned.plan.digest == planned.plan_digest
        and planned.bundle is None
        and planned.guarantee == {}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.state = "approved"  # type: ignore[misc]
    assert manager.list_releases(store) == [planned]


def test_to_dict_is_the_stored_row_and_what_show_json_prints(store, planned):
    rel = manager.approve(
        store, planned.release_id, "alice", digest=planned.plan_digest, acknowledge_non_dp=True
    )
    assert rel.to_dict() == _raw(store, rel.release_id)
    r = CliRunner().invoke(
        app, ["--workspace", str(store.workspace.root), "release", "show", rel.release_id, "--json"]
    )
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    assert shown.pop("approvals")[0]["decision"] == "approve-ack-non-dp"
    assert shown.pop("attempts") == []  # never run (release/attempts.py)
    assert shown == json.loads(json.dumps(rel.to_dict()))


def test_unknown_state_is_refused(planned):
    with pytest.raises(TamperError, match="state 'bogus'"):
        dataclasses.replace(planned, state="bogus")
    assert set(STATES) >= {"planned", "approved", "published", "failed"}


def test_tampered_row_gives_a_clear_error(store, planned, tamper):
    tamper(
        store.workspace.db_path,
        f"UPDATE releases SET state = 'done' WHERE release_id = '{planned.release_id}'",
    )
    with pytest.raises(TamperError, match="state 'done'.*audit verify"):
        manager.get_release(store, planned.release_id)
    tamper(
        store.workspace.db_path,
        "UPDATE releases SET state = 'planned'",
        "UPDATE releases SET plan = replace(plan, '\"expected_count\"', '\"count\"')",
    )
    with pytest.raises(TamperError, match="not what privrelease writes.*count"):
        manager.get_release(store, planned.release_id)
    tamper(store.workspace.db_path, "UPDATE releases SET plan = '{not json'")
    with pytest.raises(TamperError, match="store was edited"):
        manager.list_releases(store)
