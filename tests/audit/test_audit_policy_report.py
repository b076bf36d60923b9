"""Audit policy validation, report JSON/verdicts, storage in the store and rendering."""

from __future__ import annotations

import json
import math

import pytest

from accounting.errors import InvalidParameterError
from accounting.store import Store, Workspace
from audit import AuditPolicy, AuditReport, CheckResult, load_report, report_text, save_report


def test_policy_defaults_and_from_dict():
    p = AuditPolicy.from_dict(
        {"mia_max_auc": 0.55, "max_fid": 80.0, "min_downstream_accuracy": None}
    )
    assert p.mia_max_auc == 0.55 and p.max_fid == 80.0 and p.min_downstream_accuracy is None
    assert AuditPolicy.from_dict(p.to_dict()) == p
    assert AuditPolicy.from_dict(None) == AuditPolicy()


@pytest.mark.parametrize(
    "bad",
    [
        {"mia_max_aux": 0.5},
        {"mia_max_auc": math.nan},
        {"mia_max_auc": 1.5},
        {"max_near_copy_fraction": -0.1},
        {"mia_samples": 0},
        {"mia_samples": 2.5},
        {"max_fid": math.inf},
        {"require_attacks": "yes"},
        {"near_copy_ratio": 0},
        {"kanon_max_reid_rate": "high"},
        {"one_run_score": "weights"},
        {"one_run_score": 1},
    ],
)
def test_policy_rejects_bad_values(bad):
    with pytest.raises(InvalidParameterError) as exc:
        AuditPolicy.from_dict(bad)
    assert next(iter(bad)) in str(exc.value)


def _report():
    return AuditReport(
        "rel-1",
        [
            CheckResult(
                "expect_table_row_count_to_equal",
                "expectations",
                False,
                "observed 9, expected 10",
                {"observed_value": 9},
            ),
            CheckResult(
                "membership_inference",
                "attack",
                True,
                "AUC 0.51 (max 0.6)",
                {"auc": 0.51, "nan": math.nan},
                {"roc_curve": "/tmp/x.png"},
            ),
            CheckResult(
                "fid_efficientnet_lite0",
                "fidelity",
                None,
                "FID 12.0 (informational)",
                {"value": 12.0},
            ),
        ],
    )


def test_report_verdicts_json_and_text():
    r = _report()
    assert r.passed is False and [c.name for c in r.failures] == ["expect_table_row_count_to_equal"]
    assert r.verdicts() == {
        "expect_table_row_count_to_equal": "fail",
        "membership_inference": "pass",
        "fid_efficientnet_lite0": "info",
    }
    data = json.loads(r.to_json())
    assert data["passed"] is False and data["results"][1]["details"]["nan"] is None
    assert AuditReport.from_dict(data).verdicts() == r.verdicts()
    text = report_text(r)
    assert "membership_inference" in text and "FAILED" in text
    with pytest.raises(ValueError):
        CheckResult("x", "bogus", True, "s")


def test_save_and_load_roundtrip_replaces_rows(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    assert load_report(store, "rel-1") is None
    save_report(store, _report())
    loaded = load_report(store, "rel-1")
    assert loaded.verdicts() == _report().verdicts()
    assert loaded.results[1].artifacts == {"roc_curve": "/tmp/x.png"}
    assert loaded.results[0].details == {"observed_value": 9}
    # saving again replaces the release's rows (no duplicates, no stale checks)
    second = AuditReport(
        "rel-1", [CheckResult("membership_inference", "attack", False, "AUC 0.9", {})]
    )
    save_report(store, second)
    rows = store.query("SELECT check_name, passed FROM audit_results WHERE release_id = 'rel-1'")
    assert rows == [{"check_name": "membership_inference", "passed": False}]
    assert load_report(store, "rel-1").passed is False


def test_a_report_loads_in_its_own_order_whatever_the_storage_order(tmp_path, tamper):
    """PostgreSQL returns `ORDER BY ctid` in storage order, which VACUUM and other hosts' writes
    reshuffle: the report keeps each check's position and is read back in it."""
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    save_report(store, _report())
    store.backend.release()
    tamper(
        ws.db_path,
        "CREATE TEMP TABLE t AS SELECT * FROM audit_results",
        "DELETE FROM audit_results",
        "INSERT INTO audit_results SELECT * FROM t ORDER BY check_name DESC",
    )
    assert [r["check_name"] for r in store.query("SELECT * FROM audit_results ORDER BY rowid")] != [
        c.name for c in _report().results
    ]
    assert [c.name for c in load_report(store, "rel-1").results] == [
        c.name for c in _report().results
    ]


def test_failed_save_leaves_previous_rows(tmp_path):
    from accounting.errors import PrivReleaseError

    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    save_report(store, _report())
    bad = _report()
    bad.results.append(CheckResult("membership_inference", "attack", True, "duplicate name", {}))
    with pytest.raises(PrivReleaseError, match="duplicate check names"):
        save_report(store, bad)
    unserialisable = _report()
    unserialisable.results[
        2
    ].summary = None  # NOT NULL violation inside the transaction: rolled back
    with pytest.raises(Exception):
        save_report(store, unserialisable)
    assert load_report(store, "rel-1").verdicts() == _report().verdicts()
