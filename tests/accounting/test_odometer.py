"""The odometer: a bound on the spend so far that holds at every time, shown beside the fixed-sequence epsilon."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.epsilon import RDP_ORDERS
from accounting.events import DpSgd, GaussianQuery
from release.cli import app

K = privacy_filter.ODOMETER_STEPS


def test_odometer_is_the_smallest_grid_budget_whose_filter_admits():
    grid = privacy_filter.odometer_grid()
    assert len(grid) == K and grid[0] == pytest.approx(0.01) and grid[-1] > 1000
    for t in (1, 10, 100, 1000, 10000):
        rdp = curve.curve_of([DpSgd(0.01, 1.0, t)]).rdp
        odo = privacy_filter.odometer(rdp, 1e-5)
        k = int(np.argmin(np.abs(grid - odo)))
        assert grid[k] == odo
        share = 1e-5 / (K * len(privacy_filter.FILTER_ORDERS))
        assert privacy_filter.odometer_delta(1e-5) == pytest.approx(share)
        assert privacy_filter.admits(rdp, odo, share)  # its budget still holds at some order ...
        assert k == 0 or not privacy_filter.admits(
            rdp, grid[k - 1], share
        )  # ... the one below at none
        # never below the fixed-sequence epsilon nor the cap filter's, and within one grid step of its own need
        assert odo >= max(
            curve.curve_of([DpSgd(0.01, 1.0, t)]).epsilon(1e-5),
            privacy_filter.filter_epsilon(rdp, 1e-5),
        )
        assert (
            odo <= privacy_filter.filter_epsilon(rdp, share) * privacy_filter.ODOMETER_RATIO + 1e-12
        )


def test_odometer_of_nothing_is_zero_and_past_the_grid_is_infinite():
    assert privacy_filter.odometer(np.zeros(len(RDP_ORDERS)), 1e-5) == 0.0
    assert math.isinf(
        privacy_filter.odometer(curve.curve_of([GaussianQuery(0.1, count=100)]).rdp, 1e-5)
    )


def test_odometer_never_decreases_as_charges_accumulate(store):
    ledger.register_dataset(
        store,
        name="d",
        source="builtin:mnist5k",
        fingerprint="b" * 64,
        record_count=5000,
        labels=list(range(10)),
        image_shape=[28, 28],
        epsilon_cap=8.0,
        delta_cap=1e-5,
    )
    seen = [ledger.budget(store, "d").odometer_epsilon]
    for i in range(6):
        ledger.reserve(store, "d", [DpSgd(0.01, 1.0, 300)], f"r{i}")
        b = ledger.budget(store, "d")
        seen.append(b.odometer_epsilon)
        assert b.odometer_epsilon >= b.spent_rdp
    assert seen[0] == 0.0 and all(a <= b for a, b in zip(seen, seen[1:])) and seen[-1] > seen[1]


def test_budget_show_prints_the_odometer_beside_the_epsilon(tmp_path):
    runner, ws = CliRunner(), str(tmp_path / "ws")
    assert runner.invoke(app, ["--workspace", ws, "init", "--steward", "alice"]).exit_code == 0
    r = runner.invoke(
        app,
        [
            "--workspace",
            ws,
            "dataset",
            "register",
            "mnist",
            "--source",
            "builtin:mnist5k",
            "--epsilon",
            "3",
            "--delta",
            "1e-5",
            "--as",
            "alice",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(
        runner.invoke(app, ["--workspace", ws, "budget", "show", "mnist", "--json"]).output
    )
    assert (
        out["odometer_epsilon"] == 0.0
        and out["filter_epsilon"] == 0.0
        and out["filter_admits_more"]
    )
    text = runner.invoke(app, ["--workspace", ws, "budget", "show", "mnist"]).output
    assert "spent so far (odometer)" in text and "cap check (privacy filter)" in text
    assert "as if fixed in advance" in text
