"""The comparison with a dataset's earlier DP release: informs the card, never blocks."""

from __future__ import annotations

from audit.baseline import Baseline, compare
from audit.report import AuditReport, CheckResult
from release.card import BASELINE_NOT_BEATEN, dataset_card


def test_a_release_below_its_baseline_fails_the_comparison_without_blocking() -> None:
    check = compare(0.58, [Baseline("rel-a", "merf", 0.63), Baseline("rel-b", "other", 0.41)])
    assert check.passed is False and "rel-a" in check.summary and "0.630" in check.summary
    report = AuditReport("rel-x")
    report.results = [check, CheckResult("downstream_accuracy", "utility", True, "ok")]
    assert report.passed and report.verdicts()["baseline_comparison"] == "fail"
    assert compare(0.7, [Baseline("rel-a", "merf", 0.63)]).passed is True


def _card(verdicts: dict[str, str]) -> str:
    rel = {"release_id": "rel-x", "spec": {"release": {}, "privimage": {}}}
    result = {
        "mechanism": "privimage",
        "parameters": {},
        "guarantee": {"type": "dp", "epsilon_rdp": 1.0, "epsilon_pld": 0.9, "delta": 1e-5},
    }
    return dataset_card(rel, {"dataset_id": "d", "privacy_unit": "one image"}, result, 10, verdicts)


def test_the_card_says_when_a_release_does_not_beat_its_baseline() -> None:
    assert BASELINE_NOT_BEATEN in _card({"baseline_comparison": "fail"})
    assert BASELINE_NOT_BEATEN not in _card({"baseline_comparison": "pass"})
    assert BASELINE_NOT_BEATEN not in _card({})
