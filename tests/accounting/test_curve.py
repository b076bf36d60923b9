"""The running RDP curve: equal to a from-scratch composition for any history (hypothesis), kept in the
charge's transaction, and checked by `privrelease budget verify`."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.epsilon import RDP_ORDERS, epsilon_rdp
from accounting.errors import BudgetExceededError
from accounting.events import DpSgd, GaussianQuery, NonPrivateRelease
from accounting.store import Store, Workspace

EVENTS = st.one_of(
    st.builds(GaussianQuery, st.floats(2.0, 200.0), st.sampled_from([1.0, 2.0**0.5])),
    st.builds(DpSgd, st.floats(0.001, 0.05), st.floats(0.6, 3.0), st.integers(1, 300)),
)
OPS = st.lists(
    st.tuples(
        st.lists(EVENTS, min_size=1, max_size=3),
        st.sampled_from(["keep", "commit", "refund", "partial"]),
    ),
    min_size=1,
    max_size=7,
)


def _register(store, cap=50.0):
    ledger.register_dataset(
        store,
        name="d",
        source="s",
        fingerprint="f",
        record_count=10_000,
        labels=[0],
        image_shape=[8, 8],
        epsilon_cap=cap,
        delta_cap=1e-6,
    )


# each example is a fresh workspace and up to 7 charges with new DP-SGD curves (~0.35 s)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_running_curve_equals_composition_from_scratch(ops):
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Path(tmp) / "ws")
        ws.init()
        store = Store(ws)
        _register(store)
        counted = []
        for i, (events, what) in enumerate(ops):
            try:
                ledger.reserve(store, "d", events, f"r{i}")
            except BudgetExceededError:
                continue
            if what == "commit":
                ledger.commit(store, f"r{i}", events)
            elif what == "partial":
                ledger.commit(store, f"r{i}", events[:1])
            elif what == "refund":
                ledger.refund(store, f"r{i}", reason="t")
            counted += {"keep": events, "commit": events, "partial": events[:1], "refund": []}[what]
        with store.transaction() as con:
            running = curve.load(con, ledger.get_dataset(store, "d").dataset_id)
            (check,) = curve.verify(con)
        assert check["agree"]
        expected = epsilon_rdp(counted, 1e-6) if counted else 0.0
        assert running.epsilon(1e-6) == pytest.approx(expected, rel=1e-9, abs=1e-12)
        # the reader's RDP figure (its PLD is computed only when asked for)
        assert ledger.budget(store, "d").spent_rdp == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_cap_refuses_exactly_where_the_filter_stops(store):
    _register(store, cap=2.0)
    step = GaussianQuery(8.0)
    n = 0
    while True:
        try:
            ledger.reserve(store, "d", [step], f"q{n}")
        except BudgetExceededError:
            break
        n += 1
    # the stop rule is the RDP filter's (accounting.filter; tests/accounting/test_filter.py checks it in depth)
    fe = lambda k: privacy_filter.filter_epsilon(curve.curve_of([step] * k).rdp, 1e-6)  # noqa: E731
    assert fe(n) <= 2.0 < fe(n + 1)


def test_non_private_release_and_its_refund(store):
    _register(store)
    ledger.reserve(store, "d", [GaussianQuery(20.0)], "q")
    ledger.reserve(store, "d", [NonPrivateRelease("k-anon")], "k", allow_non_private=True)
    assert ledger.budget(store, "d").spent_rdp == float("inf")
    ledger.refund(store, "k", reason="failed before data")
    assert ledger.budget(store, "d").spent_rdp == pytest.approx(
        epsilon_rdp([GaussianQuery(20.0)], 1e-6)
    )


def test_workspace_without_curve_table_builds_it_from_the_charges(store, tamper):
    _register(store)
    ledger.reserve(store, "d", [DpSgd(0.01, 1.0, 100)], "a")
    tamper(
        store.workspace.db_path, "DROP TABLE rdp_curves"
    )  # a workspace from before the running curve
    assert ledger.budget(store, "d").spent_rdp == pytest.approx(
        epsilon_rdp([DpSgd(0.01, 1.0, 100)], 1e-6)
    )


def test_budget_verify_command_reports_a_difference(store, tamper):
    from release.cli import app

    _register(store)
    ledger.reserve(store, "d", [DpSgd(0.01, 1.0, 100)], "a")
    cli = lambda: CliRunner().invoke(
        app, ["--workspace", str(store.workspace.root), "budget", "verify", "--json"]
    )  # noqa: E731
    r = cli()
    assert r.exit_code == 0 and json.loads(r.output)[0]["agree"]
    tamper(store.workspace.db_path, "UPDATE charges SET planned_events = '[]'")
    r = cli()
    out = json.loads(r.output)[0]
    assert r.exit_code == 1 and not out["agree"] and out["epsilon_rdp_recomputed"] == 0


def test_dpsgd_curves_are_the_accountants_own_at_every_step_count():
    """T steps are one step's curve times T, computed once: bit for bit what dp-accounting's
    RdpAccountant gives for the self-composed event."""
    import dp_accounting

    for steps in (1, 2, 7, 1000, 123_457):
        event = DpSgd(0.013, 0.93, steps)
        acc = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
        acc.compose(event.to_dp_event())
        assert curve.curve_of([event]).rdp.tolist() == list(acc._rdp)
