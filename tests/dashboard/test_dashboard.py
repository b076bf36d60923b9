"""The Streamlit dashboard under streamlit's AppTest, over a real workspace (identities with scrypt
passwords, a registered dataset, ledger charges, release plans): every page for every role, the
actions a steward may take, and the pages and actions other roles are refused."""

from __future__ import annotations

import shutil

import duckdb
import pytest
import torch

from accounting import curve, ledger, trail
from accounting import filter as privacy_filter
from accounting.epsilon import epsilon_report
from accounting.errors import BudgetExceededError
from accounting.events import DpSgd
from dashboard.common import fmt_eps
from release import keys, manager
from release.budget import breakdown
from release.records import Release
from release.spec import ReleaseSpec
from tests.support.dashboard_workspace import (
    PASSWORDS,
    assert_clean,
    build_workspace,
    ksalsa_spec,
    new_app,
    nodes,
    sign_in,
    submit_sign_in,
    texts,
)

torch.set_num_threads(1)

EXPECTED_PAGES = {
    "steward": ["Overview", "Ledger", "Releases", "Audit trail", "Downloads"],
    "auditor": ["Overview", "Ledger", "Releases", "Audit trail", "Downloads"],
    "consumer": ["Overview", "Releases", "Downloads"],
}
USERS = {"steward": "alice", "auditor": "bob", "consumer": "carol"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("dash") / "ws")


@pytest.fixture(autouse=True)
def home(built, monkeypatch):
    monkeypatch.setenv("PRIVRELEASE_HOME", str(built.root))
    return built


def test_fixture_workspace_is_realistic(built):
    b = ledger.budget(built.store, "mnist")
    assert [c.state for c in b.charges] == ["committed", "committed", "refunded"]
    assert 0 < b.spent.epsilon_pld <= b.spent.epsilon_rdp < b.dataset.epsilon_cap
    assert all(i.password_hash for i in keys.list_identities(built.store))


# ------------------------------------------------------------------ sign-in
def test_sign_in_form_and_wrong_password_are_refused():
    at = new_app().run()
    assert_clean(at)
    assert "user" not in at.session_state
    assert [t.label for t in at.text_input] == ["Identity", "Password"]
    assert not at.sidebar.radio  # nothing but the form before signing in
    for name, password in [
        ("alice", "wrong-password"),
        ("nobody", "steward-pass-1"),
        ("alice", ""),
    ]:
        at.text_input(key="login_name").input(name)
        at.text_input(key="login_password").input(password)
        at.button[0].click().run()
        assert_clean(at)
        assert "user" not in at.session_state
        assert any("wrong password" in e.value for e in at.error)
        assert "Overview" not in texts(at)


def test_user_query_parameter_only_prefills_the_form():
    at = new_app()
    at.query_params["user"] = "bob"
    at.run()
    assert at.text_input(key="login_name").value == "bob"
    assert "user" not in at.session_state and not at.sidebar.radio  # no sign-in bypass
    at.text_input(key="login_password").input(PASSWORDS["bob"])
    at.button[0].click().run()
    assert at.session_state["user"] == "bob"


def test_sign_out():
    at = sign_in("alice")
    at.sidebar.button[0].click().run()
    assert "user" not in at.session_state
    assert [t.label for t in at.text_input] == ["Identity", "Password"]


# ------------------------------------------------------------------ pages per role
@pytest.mark.parametrize("role", ["steward", "auditor", "consumer"])
def test_each_role_sees_and_opens_only_its_pages(role):
    at = sign_in(USERS[role])
    # options are shown as ":material/icon: Page"
    assert [o.split(": ", 1)[-1] for o in at.sidebar.radio[0].options] == EXPECTED_PAGES[role]
    for page in EXPECTED_PAGES[role]:
        at.sidebar.radio[0].set_value(page).run()
        assert_clean(at)
        assert page in at.title[0].value
        assert not at.error, [e.value for e in at.error]


@pytest.mark.parametrize("page", ["Ledger", "Audit trail", "Nonexistent"])
def test_consumer_is_refused_internal_pages(page):
    # A deep link (?page=NAME) to a page the role may not open: refused with a message, nothing
    # rendered.
    at = submit_sign_in("carol", page)
    shown = (
        page if page != "Nonexistent" else "requested page does not exist or"
    )  # unknown names are not echoed
    assert any(
        f"{shown} page is not available to a consumer" in e.value
        or f"{shown} is not available to a consumer" in e.value
        for e in at.error
    )
    assert not at.dataframe and not at.title
    # The same deep link works for a role that may open it.
    if page != "Nonexistent":
        at = sign_in("bob", page)
        assert not at.error and page in at.title[0].value


def test_overview_shows_budget_gauge_and_recent_releases(built):
    b = ledger.budget(built.store, "mnist")
    at = sign_in("alice")
    assert at.title[0].value.endswith("Overview")
    assert len(nodes(at, "image")) == 1  # the matplotlib budget gauge of the one dataset
    text = texts(at)
    assert "4,000 records" in text and "δ = 1e-05" in text
    assert "Plans awaiting approval: 1" in text  # the one planned k-SALSA release
    recent = at.dataframe[0].value
    assert built.planned[0] in list(recent["release"])
    assert b.spent.epsilon_rdp < b.dataset.epsilon_cap


def test_consumer_overview_lists_no_unpublished_release(built):
    at = sign_in("carol")
    assert "Published releases: 0" in texts(at)
    assert not any(built.planned[0] in str(df.value) for df in at.dataframe)
    assert "No published releases yet." in texts(at)


# ------------------------------------------------------------------ ledger
def test_ledger_table_filters_and_cumulative_plot(built):
    rows = [r.to_dict() for r in breakdown(ledger.budget(built.store, "mnist"))]
    at = sign_in("bob", "Ledger")
    table = at.dataframe[0].value
    assert list(table["run"]) == [r["run_id"] for r in rows]
    assert list(table["cum. ε RDP"]) == [fmt_eps(r["cumulative_epsilon_rdp"]) for r in rows]
    assert list(table["cum. ε PLD"]) == [fmt_eps(r["cumulative_epsilon_pld"]) for r in rows]
    assert nodes(at, "vega_lite_chart")  # cumulative epsilon over time
    at.multiselect(key="ledger_states").select("refunded").run()
    assert list(at.dataframe[0].value["run"]) == ["run-sgd-2"]
    at.multiselect(key="ledger_states").unselect("refunded").run()
    at.text_input(key="ledger_search").input("dp-sgd").run()
    assert list(at.dataframe[0].value["run"]) == ["run-sgd-1", "run-sgd-2"]
    at.text_input(key="ledger_search").input("no such run").run()
    assert at.dataframe[0].value.empty


def _what_if(at, sigma: float, q: float, steps: int):
    at.number_input(key="whatif_sigma").set_value(sigma)
    at.number_input(key="whatif_q").set_value(q)
    at.number_input(key="whatif_steps").set_value(steps)
    next(b for b in at.button if b.label == "Compute ε").click().run()
    assert_clean(at)
    return at


def test_what_if_matches_the_accountant_and_flags_the_cap(built):
    b = ledger.budget(built.store, "mnist")
    at = _what_if(sign_in("alice", "Ledger"), 1.1, 0.02, 300)
    expected = epsilon_report(b.history + [DpSgd(0.02, 1.1, 300)], b.dataset.delta_cap)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["ε now (RDP)"] == fmt_eps(b.spent.epsilon_rdp)
    assert metrics["ε after (RDP)"] == fmt_eps(expected.epsilon_rdp)
    assert metrics["ε after (PLD)"] == fmt_eps(expected.epsilon_pld)
    assert metrics["Remaining after (cap − RDP)"] == fmt_eps(
        b.dataset.epsilon_cap - expected.epsilon_rdp
    )
    assert any("Fits the cap" in s.value for s in at.success)
    # Far too little noise: the ledger would refuse it, and the panel says so.
    _what_if(at, 0.8, 0.2, 50)
    assert any("Exceeds the cap 8" in e.value for e in at.error)
    # Invalid parameters are shown as the accounting error's message, not a traceback.
    _what_if(at, 0.0, 0.2, 50)
    assert any("noise multiplier" in e.value and "must be > 0" in e.value for e in at.error)
    assert ledger.budget(built.store, "mnist").history == b.history  # nothing was charged


def test_what_if_gives_the_ledgers_filter_verdict_not_rdp_under_the_cap(built):
    """Regression: the panel said "Fits the cap" whenever RDP epsilon <= cap, while the ledger
    refuses by its privacy filter, which is stricter. Find a run the RDP figure would admit and the
    filter refuses."""
    b = ledger.budget(built.store, "mnist")
    cap, delta = b.dataset.epsilon_cap, b.dataset.delta_cap
    steps = next(
        t
        for t in range(50, 5000, 10)
        if not privacy_filter.admits(
            curve.curve_of(b.history + [DpSgd(0.02, 1.1, t)]).rdp, cap, delta
        )
    )
    assert (
        epsilon_report(b.history + [DpSgd(0.02, 1.1, steps)], delta).epsilon_rdp < cap
    )  # RDP alone would admit
    at = _what_if(sign_in("alice", "Ledger"), 1.1, 0.02, steps)
    assert any(
        f"Exceeds the cap {cap:g}" in e.value and "privacy filter" in e.value for e in at.error
    )
    assert not any("Fits the cap" in s.value for s in at.success)
    with pytest.raises(BudgetExceededError):  # and the ledger agrees
        ledger.reserve(
            built.store, "mnist", [DpSgd(0.02, 1.1, steps)], run_id="whatif-check", actor="alice"
        )


# ------------------------------------------------------------------ releases: approve / reject
def _new_plan(built) -> Release:
    return manager.create_plan(built.store, ksalsa_spec(), "alice")


def test_plan_card_shows_epsilon_preview_and_warnings(built):
    rel = _new_plan(built)
    at = sign_in("alice", "Releases")
    text = texts(at)
    assert rel.release_id in text and rel.plan_digest[:16] in text
    assert "ε before (RDP): " + fmt_eps(rel.plan.epsilon_before["epsilon_rdp"]) in text
    assert "ε after (RDP): ∞ (no DP)" in text  # a k-anonymous release voids the DP guarantee
    assert any("NO differential-privacy guarantee" in w.value for w in at.warning)


def test_plan_card_lists_the_mechanisms_choices(built):
    spec = {"release": {"dataset": "mnist", "mechanism": "merf", "n_images": 100}}
    merf = {"epsilon": 7.0, "steps": 5, "n_features": 256, "perceptual_share": 0}
    rel = manager.create_plan(built.store, ReleaseSpec.from_dict({**spec, "merf": merf}), "alice")
    text = texts(sign_in("alice", "Releases"))
    assert rel.release_id in text
    assert "Choices:" in text and "perceptual features: off (pixels only)" in text


def test_steward_approves_only_with_acknowledgement(built):
    rel = _new_plan(built)
    rid = rel.release_id
    at = sign_in("alice", "Releases")
    at.button(key=f"approve_{rid}").click().run()
    assert_clean(at)
    # The manager's refusal is shown as a message; nothing changed.
    assert any("acknowledge" in e.value.lower() and rid in e.value for e in at.error)
    assert manager.get_release(built.store, rid).state == "planned"
    at.checkbox(key=f"ack_{rid}").check().run()
    at.button(key=f"approve_{rid}").click().run()
    assert_clean(at)
    assert any(f"Approved {rid}" in s.value for s in at.success)
    assert manager.get_release(built.store, rid).state == "approved"
    (approval,) = manager.approvals(built.store, rid)
    assert approval["approver"] == "alice" and approval["decision"] == "approve-ack-non-dp"
    assert approval["plan_digest"] == rel.plan_digest
    # The approved release is no longer waiting; its detail offers the steward the Run action.
    assert not [b for b in at.button if b.key == f"approve_{rid}"]
    at.selectbox(key="release").set_value(rid).run()
    assert at.button(key=f"run_{rid}").label.startswith("Run release")


def test_steward_rejects_only_with_a_reason(built):
    rid = _new_plan(built).release_id
    at = sign_in("alice", "Releases")
    at.button(key=f"reject_{rid}").click().run()
    assert any("Give a reason" in e.value for e in at.error)
    assert manager.get_release(built.store, rid).state == "planned"
    at.text_input(key=f"reason_{rid}").input("k too small for this data").run()
    at.button(key=f"reject_{rid}").click().run()
    assert_clean(at)
    rel = manager.get_release(built.store, rid)
    assert rel.state == "rejected" and rel.reason == "k too small for this data"
    assert trail.entries(built.store, limit=1)[0]["action"] == "release.reject"


def test_auditor_sees_plans_but_no_actions(built):
    rid = _new_plan(built).release_id
    at = sign_in("bob", "Releases")
    assert rid in texts(at)
    assert "Only a steward can approve or reject a plan." in texts(at)
    keys_shown = {b.key for b in at.button}
    assert not any(
        k and k.startswith(("approve_", "reject_", "run_", "publish_")) for k in keys_shown
    )
    assert not at.checkbox
    assert manager.get_release(built.store, rid).state == "planned"


def test_consumer_never_sees_plans_or_unpublished_releases(built):
    at = sign_in("carol", "Releases")
    assert "Plans awaiting approval" not in texts(at)
    assert "No published releases yet." in texts(at)
    # Asking for an unpublished release by id is refused, not shown.
    at.session_state["release"] = built.planned[0]
    at.run()
    assert_clean(at)
    assert any(
        "not available to you" in e.value and "published releases only" in e.value for e in at.error
    )
    assert built.planned[0] not in " ".join(str(d.value) for d in at.dataframe)
    assert not at.json


def test_release_detail_of_a_plan(built):
    rid = built.planned[0]
    at = sign_in("bob", "Releases")
    at.selectbox(key="release").set_value(rid).run()
    assert_clean(at)
    text = texts(at)
    assert "Not audited yet" in text and "No images yet" in text
    assert [t.label for t in at.tabs] == [
        "Parameters",
        "Audit report",
        "Samples",
    ]  # no cluster viewer yet


def test_release_detail_shows_the_attempts_of_a_run_that_stopped(built):
    """Issue 66: the history of a run's attempts (when, how each ended, items, retries)."""
    store = built.store
    rel = manager.create_plan(store, ksalsa_spec(k=7), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest, acknowledge_non_dp=True)
    for reason in ("ItemFailedError: item 3 of 60 failed the same way twice", None):
        manager._set_state(
            store, rel.release_id, manager.RUNNABLE, "running", "alice", "release.run", {}
        )
        if reason:  # the second attempt is still running (or died: no record)
            manager._fail(store, rel.release_id, "alice", reason)
    at = sign_in("alice", "Releases")
    at.selectbox(key="release").set_value(rel.release_id).run()
    assert_clean(at)
    [expander] = [e for e in at.expander if e.label == "Run attempts (2)"]
    [table] = expander.dataframe
    rows = table.value.to_dict("records")
    assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "failed"), (2, "running")]
    assert rows[0]["why it stopped"].startswith("ItemFailedError: item 3 of 60")


# ------------------------------------------------------------------ audit trail
def test_audit_trail_verified(built):
    at = sign_in("bob", "Audit trail")
    v = trail.verify(built.store)
    assert any("Chain verified" in s.value and f"{v.length} entries" in s.value for s in at.success)
    df = at.dataframe[0].value
    assert (
        set(df["status"]) == {"ok"} and len(df) >= v.length - 2
    )  # newest-first, a few added meanwhile at most
    at.multiselect(key="trail_actions").select("identity.password").run()
    assert set(at.dataframe[0].value["action"]) == {"identity.password"}


def test_audit_trail_break_is_highlighted(built, tmp_path, monkeypatch):
    copy = tmp_path / "ws"
    # the process may still hold store.duckdb from the last page (let go 50 ms after its last
    # transaction, which checkpoints and removes the WAL): a copy made meanwhile raced that removal
    built.store.backend.release()
    shutil.copytree(built.root, copy)
    con = duckdb.connect(str(copy / "store.duckdb"))  # an attacker editing one entry behind the API
    con.execute('UPDATE audit_trail SET payload = \'{"name": "mallory"}\' WHERE seq = 3')
    con.close()
    monkeypatch.setenv("PRIVRELEASE_HOME", str(copy))
    at = sign_in("alice", "Audit trail")
    assert any("Chain BROKEN" in e.value for e in at.error)
    assert "entry 3" in texts(at) and "edited" in texts(at)
    df = at.dataframe[0].value
    assert list(df.loc[df["status"] == "BROKEN", "seq"]) == [3]
    at.toggle(key="trail_broken").set_value(True).run()
    assert list(at.dataframe[0].value["seq"]) == [3]


# ------------------------------------------------------------------ downloads and errors
def test_downloads_without_bundles_shows_the_public_key(built):
    at = sign_in("carol", "Downloads")
    pem = (built.root / "keys" / "release.pub").read_text()
    assert any(c.value.strip() == pem.strip() for c in at.code)
    assert [d.proto.label for d in nodes(at, "download_button")] == ["release.pub"]
    assert "No published bundles yet." in texts(at)


def test_missing_workspace_is_a_message_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVRELEASE_HOME", str(tmp_path / "nowhere"))
    at = new_app().run()
    assert_clean(at)
    assert any("No privrelease workspace" in e.value for e in at.error)
    monkeypatch.delenv("PRIVRELEASE_HOME")
    at = new_app().run()
    assert any("PRIVRELEASE_HOME is not set" in e.value for e in at.error)


def test_image_grids_upscale_digits_but_not_photographs() -> None:
    import numpy as np

    from dashboard.charts import image_grid

    digits = image_grid(np.zeros((2, 28, 28), np.uint8), columns=2, scale=3)
    photos = image_grid(np.zeros((2, 512, 384, 3), np.uint8), columns=2, scale=3)
    assert digits.shape == ((28 + 4) * 3, (2 * 30 + 2) * 3, 3)  # tiles and borders, 3x
    assert photos.shape == (512 + 4, 2 * 386 + 2, 3)  # 1:1, not 1536 px a tile
