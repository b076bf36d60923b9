"""release.budget: the one budget API the CLI and the dashboard display (summary, breakdown, what-if)."""

from __future__ import annotations

import json
import math
from dataclasses import FrozenInstanceError

import pytest
from typer.testing import CliRunner

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.epsilon import epsilon_report
from accounting.errors import InvalidParameterError
from accounting.events import DpSgd, GaussianQuery
from release import budget as budgets


def _charged(store):
    ledger.register_dataset(
        store,
        name="mnist",
        source="builtin:mnist5k",
        fingerprint="f" * 64,
        record_count=5000,
        labels=list(range(10)),
        image_shape=[28, 28],
        epsilon_cap=5.0,
        delta_cap=1e-5,
    )
    first = [GaussianQuery(20, 3**0.5), DpSgd(0.01, 1.0, 1000)]
    ledger.reserve(store, "mnist", first, "run-1", description="privimage")
    ledger.commit(store, "run-1", [first[0], DpSgd(0.01, 1.0, 600)])
    ledger.reserve(store, "mnist", [DpSgd(0.01, 1.0, 100)], "run-2")
    ledger.refund(store, "run-2", reason="failed before reading data")
    ledger.reserve(store, "mnist", [DpSgd(0.02, 1.2, 200)], "run-3")
    return [first[0], DpSgd(0.01, 1.0, 600)], [DpSgd(0.02, 1.2, 200)]


def test_breakdown_is_each_charge_and_the_composed_history_up_to_it(store):
    committed, reserved = _charged(store)
    rows = budgets.breakdown(budgets.budget(store, "mnist"))
    assert [(r.run_id, r.state) for r in rows] == [
        ("run-1", "committed"),
        ("run-2", "refunded"),
        ("run-3", "reserved"),
    ]
    assert rows[0].epsilon_rdp == pytest.approx(epsilon_report(committed, 1e-5).epsilon_rdp)
    assert (
        rows[1].epsilon_rdp == 0
        and rows[1].cumulative_epsilon_rdp == rows[0].cumulative_epsilon_rdp
    )
    assert "DP-SGD" in rows[1].events  # a refunded charge shows what it planned
    whole = epsilon_report(committed + reserved, 1e-5)
    assert rows[2].cumulative_epsilon_rdp == pytest.approx(whole.epsilon_rdp)
    assert rows[2].cumulative_epsilon_pld == pytest.approx(whole.epsilon_pld)
    with pytest.raises(FrozenInstanceError):
        rows[0].state = "refunded"  # type: ignore[misc]


def test_summary_is_the_ledgers_budget(store):
    committed, reserved = _charged(store)
    b = budgets.budget(store, "mnist")
    s = budgets.summary(b)
    assert s.spent_epsilon_rdp == pytest.approx(
        epsilon_report(committed + reserved, 1e-5).epsilon_rdp
    )
    assert s.remaining_epsilon_rdp == pytest.approx(5.0 - s.spent_epsilon_rdp)
    assert s.charges_counted == 2 and not s.dp_void and s.filter_admits_more
    d = s.to_dict()
    assert d["filter_epsilon"] == pytest.approx(b.filter_epsilon) and d["delta"] == 1e-5


def test_what_if_composes_with_the_history_and_asks_the_caps_filter(store):
    committed, reserved = _charged(store)
    b = budgets.budget(store, "mnist")
    w = budgets.what_if(0.01, 500, sigma=0.8, history=b)
    planned = DpSgd(0.01, 0.8, 500)
    after = epsilon_report(committed + reserved + [planned], 1e-5)
    assert (w.epsilon_rdp, w.epsilon_pld) == (
        pytest.approx(after.epsilon_rdp),
        pytest.approx(after.epsilon_pld),
    )
    fits, filter_eps = privacy_filter.cap_check(
        curve.curve_of(committed + reserved + [planned]).rdp, 5.0, 1e-5
    )
    assert (w.fits_cap, w.filter_epsilon) == (fits, pytest.approx(filter_eps))
    assert w.delta == 1e-5 and w.composed_with == "mnist" and w.described == planned.describe()
    alone = budgets.what_if(0.01, 500, epsilon=2.0, delta=1e-5)
    assert (
        alone.epsilon_rdp <= 2.0 and alone.epsilon_cap is None and "fits_cap" not in alone.to_dict()
    )
    assert math.isfinite(alone.sigma)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"sigma": 1.0, "epsilon": 2.0, "delta": 1e-5}, "exactly one"),
        ({"sigma": 1.0}, "Give --delta"),
    ],
)
def test_what_if_refuses_what_it_cannot_answer(kw, message):
    with pytest.raises(InvalidParameterError, match=message):
        budgets.what_if(0.01, 100, **kw)


def test_what_if_refuses_a_delta_above_the_datasets_cap(store):
    _charged(store)
    with pytest.raises(InvalidParameterError, match="above mnist's delta cap"):
        budgets.what_if(0.01, 100, sigma=1.0, delta=1e-3, history=budgets.budget(store, "mnist"))


def test_the_cli_prints_the_apis_figures(store):
    from release.cli import app

    _charged(store)
    root = str(store.workspace.root)
    r = CliRunner().invoke(app, ["--workspace", root, "budget", "show", "mnist", "--json"])
    assert r.exit_code == 0, r.output
    b = budgets.budget(store, "mnist")
    shown = json.loads(r.output)
    assert [c["run_id"] for c in shown.pop("charges")] == [c.run_id for c in budgets.breakdown(b)]
    assert shown == json.loads(json.dumps(budgets.summary(b).to_dict()))
    r = CliRunner().invoke(
        app,
        [
            "--workspace",
            root,
            "budget",
            "plan",
            "--sample-rate",
            "0.01",
            "--steps",
            "500",
            "--sigma",
            "0.8",
            "--dataset",
            "mnist",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == json.loads(
        json.dumps(budgets.what_if(0.01, 500, sigma=0.8, history=b).to_dict())
    )
