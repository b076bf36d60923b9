"""The versioned release predicate and the typed run record: published bundles keep verifying, unknown versions
and foreign shapes get a clear error."""

from __future__ import annotations

import json
import shutil
import tarfile
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from accounting.errors import TamperError
from release.manifest import STATEMENT_FILE, parse_statement
from release.predicate import PREDICATE_TYPE, ReleasePredicate, UnsupportedPredicateError
from release.records import Release, RunRecord
from release.verify import verify_bundle

# A bundle published (k-SALSA, tests/support/dashboard_workspace.py) by privrelease before the predicate was typed.
PUBLISHED = Path(__file__).parent / "data" / "published-v1"
TARBALL = PUBLISHED / "rel-0dc78f0430.tar.gz"


def _signed_statement() -> dict:
    with tarfile.open(TARBALL) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(STATEMENT_FILE))
        return json.loads(tar.extractfile(member).read())


def test_a_bundle_published_before_still_verifies_and_its_predicate_round_trips(tmp_path):
    copy = tmp_path / TARBALL.name
    shutil.copy(TARBALL, copy)
    result = verify_bundle(copy, PUBLISHED / "release.pub")
    assert result.ok, result.problems
    typed = result.release_predicate
    assert (
        typed is not None
        and typed.to_json() == result.predicate == _signed_statement()["predicate"]
    )
    assert typed.release_id == "rel-0dc78f0430" and typed.mechanism == "ksalsa" and not typed.is_dp
    assert typed.approval.steward == ("alice",) and typed.ledger_position.trail_seq == 23
    assert typed.history is not None and typed.extra == {}
    with pytest.raises(FrozenInstanceError):
        typed.release_id = "other"  # type: ignore[misc]


def test_an_unknown_predicate_version_is_refused_with_what_to_do():
    predicate = _signed_statement()["predicate"]
    with pytest.raises(
        UnsupportedPredicateError, match="version 2; this privrelease reads version 1"
    ):
        ReleasePredicate.from_json(predicate, "https://privrelease.dev/release/v2")
    statement = {**_signed_statement(), "predicateType": "https://privrelease.dev/release/v2"}
    with pytest.raises(TamperError, match="version 2; this privrelease reads version 1. Install"):
        parse_statement(json.dumps(statement).encode())
    with pytest.raises(UnsupportedPredicateError, match="not a privrelease release predicate"):
        ReleasePredicate.from_json(predicate, "https://example.org/other/v1")


def test_a_predicate_missing_a_field_is_named():
    predicate = {
        k: v for k, v in _signed_statement()["predicate"].items() if k != "ledger_position"
    }
    with pytest.raises(UnsupportedPredicateError, match="ledger_position"):
        ReleasePredicate.from_json(predicate, PREDICATE_TYPE)
    with pytest.raises(UnsupportedPredicateError, match="not a JSON object"):
        ReleasePredicate.from_json(["a list"], PREDICATE_TYPE)


def test_extra_keys_of_a_v1_predicate_survive_the_round_trip():
    predicate = {**_signed_statement()["predicate"], "future_note": {"x": 1}}
    typed = ReleasePredicate.from_json(predicate, PREDICATE_TYPE)
    assert typed.extra == {"future_note": {"x": 1}} and typed.to_json() == predicate


RESULT = {
    "mechanism": "ksalsa",
    "guarantee": {"type": "k-anonymity", "k": 5},
    "parameters": {"k": 5},
    "executed_events": [{"mechanism": "non_private"}],
    "generator": None,
    "artifacts": {},
    "count": 12,
    "charge_id": "rel-1",
}


def test_the_run_record_keeps_the_stored_json():
    record = RunRecord.from_json(RESULT)
    assert record.count == 12 and record.guarantee["k"] == 5 and record.bundle is None
    assert record.to_json() == RESULT
    published = {**RESULT, "bundle": {"path": "/b", "tarball": "/b.tar.gz"}}
    assert RunRecord.from_json(published).to_json() == published


def test_a_stored_result_privrelease_did_not_write_is_tamper(store):
    from release import keys, manager
    from release.data import register_from_source
    from release.spec import ReleaseSpec

    keys.create_identity(store, "alice", "steward")
    register_from_source(store, "mnist", "builtin:mnist5k", 10.0, 1e-5)
    rel = manager.create_plan(
        store,
        ReleaseSpec.from_dict(
            {
                "release": {"dataset": "mnist", "mechanism": "ksalsa"},
                "ksalsa": {"k": 5, "preset": "tiny"},
            }
        ),
        "alice",
    )
    row = store.query("SELECT * FROM releases WHERE release_id = ?", [rel.release_id])[0]
    assert Release.from_row({**row, "result": json.dumps(RESULT)}).result == RunRecord.from_json(
        RESULT
    )
    broken = {k: v for k, v in RESULT.items() if k != "parameters"}
    with pytest.raises(TamperError, match="store was edited"):
        Release.from_row({**row, "result": json.dumps(broken)})
