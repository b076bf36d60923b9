"""Specs, plans, approvals and roles (no training: planning and signing only)."""

import pytest

from accounting import ledger, trail
from accounting.errors import (
    InvalidParameterError,
    LedgerStateError,
    PermissionDeniedError,
    PrivReleaseError,
    TamperError,
    UnknownDatasetError,
)
from release import approval, kanon_estimate, keys, manager, planning
from release.data import load_registered, register_from_source
from release.spec import ReleaseSpec

KSALSA = {
    "release": {"dataset": "mnist", "mechanism": "ksalsa"},
    "ksalsa": {"k": 5, "preset": "tiny"},
}
PRIVIMAGE = {
    "release": {"dataset": "mnist", "mechanism": "privimage", "n_images": 100},
    "privimage": {"epsilon": 4.0, "preset": "tiny", "public": "builtin:uci-digits"},
}


@pytest.fixture
def ws_store(store):
    keys.create_identity(store, "alice", "steward")
    keys.create_identity(store, "bob", "auditor")
    keys.create_identity(store, "carol", "consumer")
    register_from_source(store, "mnist", "builtin:mnist5k", 10.0, 1e-5)
    return store


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"release": {"mechanism": "ksalsa"}}, "dataset"),
        ({"release": {"dataset": "mnist", "mechanism": "gan"}}, "mechanism"),
        ({"release": {"dataset": "mnist", "mechanism": "ksalsa", "n_images": -3}}, "n_images"),
        ({"release": {"dataset": "mnist", "mechanism": "ksalsa", "colour": 1}}, "Unknown key"),
        ({**KSALSA, "privimage": {}}, "also has"),
        (
            {
                "release": {"dataset": "mnist", "mechanism": "ksalsa"},
                "ksalsa": {"k": 5, "preset": "huge"},
            },
            "preset",
        ),
    ],
)
def test_bad_specs_are_refused_clearly(bad, match):
    with pytest.raises(InvalidParameterError, match=match):
        ReleaseSpec.from_dict(bad)


def test_spec_file_errors(tmp_path):
    with pytest.raises(InvalidParameterError, match="does not exist"):
        ReleaseSpec.from_toml(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[release\n")
    with pytest.raises(InvalidParameterError, match="not valid TOML"):
        ReleaseSpec.from_toml(bad)


def test_plan_previews_epsilon_and_changes_no_budget(ws_store):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    p = rel.plan
    assert rel.state == "planned" and p.epsilon_before["epsilon_rdp"] == 0
    assert 0 < p.epsilon_after["epsilon_pld"] <= p.epsilon_after["epsilon_rdp"] <= 4.0 + 1e-9
    assert p.events[0]["mechanism"] == "gaussian_query" and p.events[1]["mechanism"] == "dpsgd"
    assert ledger.budget(ws_store, "mnist").charges == []  # planning reserves nothing


def test_unknown_dataset_plan(ws_store):
    with pytest.raises(UnknownDatasetError):
        manager.create_plan(
            ws_store,
            ReleaseSpec.from_dict({**KSALSA, "release": {"dataset": "x", "mechanism": "ksalsa"}}),
            "alice",
        )


def test_bad_mechanism_parameter(ws_store):
    spec = {
        "release": {"dataset": "mnist", "mechanism": "privimage"},
        "privimage": {"epsilon": float("nan"), "preset": "tiny"},
    }
    with pytest.raises(InvalidParameterError, match="epsilon"):
        manager.create_plan(ws_store, ReleaseSpec.from_dict(spec), "alice")
    spec["privimage"] = {"epsilon": 4.0, "colour": "red"}
    with pytest.raises(InvalidParameterError, match="Unknown"):
        manager.create_plan(ws_store, ReleaseSpec.from_dict(spec), "alice")
    assert ws_store.query("SELECT * FROM releases") == []


def test_ksalsa_plan_warns_and_needs_acknowledgement(ws_store):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(KSALSA), "alice")
    assert rel.plan.requires_acknowledgement
    assert any(
        "no longer hold" in w for w in rel.plan.warnings
    )  # rule 5: the dataset loses its DP meaning
    assert rel.plan.expected_count == 4000 // 5
    with pytest.raises(PermissionDeniedError, match="acknowledge"):
        manager.approve(ws_store, rel.release_id, "alice")
    assert manager.get_release(ws_store, rel.release_id).state == "planned"
    manager.approve(ws_store, rel.release_id, "alice", acknowledge_non_dp=True)
    assert approval.verified_approval(ws_store, manager.get_release(ws_store, rel.release_id))[
        "acknowledge_non_dp"
    ]


def test_only_a_steward_approves(ws_store):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    for who in ("bob", "carol"):
        with pytest.raises(PermissionDeniedError, match="steward"):
            manager.approve(ws_store, rel.release_id, who)
    with pytest.raises(PrivReleaseError):
        manager.approve(ws_store, rel.release_id, "mallory")
    assert manager.approvals(ws_store, rel.release_id) == []


def test_approval_of_a_different_plan_is_refused(ws_store):
    a = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    b = manager.create_plan(ws_store, ReleaseSpec.from_dict(KSALSA), "alice")
    with pytest.raises(TamperError, match="different or edited plan"):
        manager.approve(ws_store, a.release_id, "alice", digest=b.plan_digest)


def test_plan_edited_after_approval_cannot_run(ws_store, tamper):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    manager.approve(ws_store, rel.release_id, "alice", digest=rel.plan_digest)
    tamper(
        ws_store.workspace.db_path,
        "UPDATE releases SET plan = replace(plan, '\"expected_count\": 100', '\"expected_count\": 99999')",
    )
    with pytest.raises(TamperError, match="edited"):
        manager.run_release(ws_store, rel.release_id, "alice")
    assert ledger.budget(ws_store, "mnist").charges == []  # nothing reserved


def test_forged_approval_signature_is_refused(ws_store, tamper):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    manager.approve(ws_store, rel.release_id, "alice", digest=rel.plan_digest)
    tamper(ws_store.workspace.db_path, "UPDATE approvals SET signature = repeat('ab', 64)")
    with pytest.raises(TamperError, match="no valid steward approval"):
        approval.verified_approval(ws_store, manager.get_release(ws_store, rel.release_id))


def test_unapproved_release_cannot_run_or_publish(ws_store):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    with pytest.raises(LedgerStateError, match="planned"):
        manager.run_release(ws_store, rel.release_id, "alice")
    with pytest.raises(LedgerStateError):
        manager.publish(ws_store, rel.release_id, "alice")


def test_reject_needs_reason_and_is_final(ws_store):
    rel = manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    with pytest.raises(PrivReleaseError, match="reason"):
        manager.reject(ws_store, rel.release_id, "alice", "  ")
    manager.reject(ws_store, rel.release_id, "alice", "epsilon too generous")
    assert manager.get_release(ws_store, rel.release_id).state == "rejected"
    with pytest.raises(LedgerStateError):
        manager.approve(ws_store, rel.release_id, "alice")
    assert trail.verify(ws_store).ok


def test_consumers_see_only_published(ws_store):
    manager.create_plan(ws_store, ReleaseSpec.from_dict(PRIVIMAGE), "alice")
    assert manager.list_releases(ws_store, keys.get_identity(ws_store, "carol")) == []
    assert len(manager.list_releases(ws_store, keys.get_identity(ws_store, "bob"))) == 1


def test_changed_data_is_refused(tmp_path, store):
    import numpy as np

    path = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(
        path, images=rng.integers(0, 255, (50, 8, 8), dtype=np.uint8), labels=np.arange(50) % 2
    )
    register_from_source(store, "toy", str(path), 1.0, 1e-3, labels="0,1")
    np.savez(
        path, images=rng.integers(0, 255, (50, 8, 8), dtype=np.uint8), labels=np.arange(50) % 2
    )
    with pytest.raises(PrivReleaseError, match="changed since"):
        load_registered(store, "toy")


@pytest.mark.slow  # end to end, about a minute on 2 cores (CI runs the slow tests too)
def test_a_plan_the_filter_would_refuse_names_the_largest_target_that_fits(ws_store):
    """Target epsilon = the cap: the RDP epsilon is calibrated to the target, but the ledger admits through the
    stricter filter, so the plan warns; the warning names a target that does fit (bisection over plans)."""
    spec = ReleaseSpec.from_dict(
        {**PRIVIMAGE, "privimage": {**PRIVIMAGE["privimage"], "epsilon": 10.0}}
    )
    warnings = planning.preview(ws_store, spec)["warnings"]
    refusal = next(w for w in warnings if "will be refused" in w)
    import re

    suggested = float(
        re.search(r"largest target that fits is about epsilon = ([0-9.]+)", refusal).group(1)
    )
    assert 1.0 < suggested < 10.0
    fits = ReleaseSpec.from_dict(
        {**PRIVIMAGE, "privimage": {**PRIVIMAGE["privimage"], "epsilon": suggested}}
    )
    assert not [w for w in planning.preview(ws_store, fits)["warnings"] if "will be refused" in w]
    from synth.kinds.datasets import load_public

    budget = ledger.budget(
        ws_store, "mnist"
    )  # and the largest, to the search's precision: 10 / 2**8
    from accounting.largest_target import admits

    beyond = planning.events_at(
        spec, budget, load_public("builtin:uci-digits", budget.dataset.source)
    )(suggested + 10 / 2**8 + 0.01)
    ds = budget.dataset
    assert beyond is None or not admits(budget.history, beyond, ds.epsilon_cap, ds.delta_cap)


def test_plan_reports_progress_while_it_calibrates(ws_store):
    # a target no other test plans: the calibration runs (a process remembers those it solved)
    spec = {**PRIVIMAGE, "privimage": {**PRIVIMAGE["privimage"], "epsilon": 4.123}}
    calls = []
    manager.create_plan(
        ws_store,
        ReleaseSpec.from_dict(spec),
        "alice",
        lambda stage, done, total: calls.append((stage, done, total)),
    )
    last = {}
    for stage, done, total in calls:
        last[stage] = (done, total)
    assert list(last) == [
        "plan: public data and mechanism",
        "plan: calibrating the noise",
        "plan: epsilon before and after (RDP, PLD)",
    ]
    assert all(done == total > 0 for done, total in last.values()), last
    assert sum(stage == "plan: calibrating the noise" for stage, _, _ in calls) > 10


def test_ksalsa_plan_warns_when_the_membership_audit_will_likely_refuse(ws_store, tmp_path):
    """Issue 36: estimated from public data, k and n only: the same for any data of that size and shape."""
    import numpy as np

    def plan_warnings(dataset: str, k: int) -> list[str]:
        spec = {
            "release": {"dataset": dataset, "mechanism": "ksalsa"},
            "ksalsa": {"k": k, "preset": "tiny"},
        }
        calls = []
        rel = manager.create_plan(
            ws_store, ReleaseSpec.from_dict(spec), "alice", lambda *a: calls.append(a)
        )
        assert ("plan: k-anonymity attack estimate", 8, 8) in calls
        return [w for w in rel.plan.warnings if "cluster-membership audit" in w]

    [warning] = plan_warnings("mnist", 2)
    assert "will likely refuse" in warning and "kanon_max_attack_precision 0.9" in warning
    suggested = int(warning.split("; k = ")[1].split()[0])
    assert plan_warnings("mnist", suggested) == []
    noise = np.random.default_rng(0).integers(0, 256, (4000, 28, 28), dtype=np.uint8)
    np.savez(tmp_path / "noise.npz", images=noise, labels=np.arange(4000) % 10)
    register_from_source(ws_store, "noise", str(tmp_path / "noise.npz"), 10.0, 1e-5, labels="0-9")
    kanon_estimate._ESTIMATES.clear()  # computed afresh: it still reads nothing of the (different) data
    assert plan_warnings("noise", 2) == [warning]


def test_the_fitting_target_search_survives_targets_below_the_prior_spend(ws_store):
    """After a spend of epsilon 8 of the cap 10, a merf plan at target 10 would be refused by the
    filter; the search for a target that fits tries targets below 8, whose calibration says the
    budget is exceeded: those count as 'does not fit' (it used to end the preview with that error)."""
    from accounting.events import GaussianQuery

    ledger.reserve(ws_store, "mnist", [GaussianQuery(0.6)], "spent", description="spent")
    ledger.commit(ws_store, "spent", [GaussianQuery(0.6)])
    spec = ReleaseSpec.from_dict(
        {
            "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 100},
            "merf": {"epsilon": 10.0, "steps": 5, "n_features": 256},
        }
    )
    warnings = planning.preview(ws_store, spec)["warnings"]
    refusal = next(w for w in warnings if "will be refused" in w)
    import re

    found = re.search(r"largest target that fits is about epsilon = ([0-9.]+)", refusal)
    assert found, refusal  # the search starts above the spend (8.6): it used to find nothing
    suggested = float(found.group(1))
    assert 8.6 < suggested < 10.0
    fits = ReleaseSpec.from_dict(
        {**spec.as_dict(), "merf": {**spec.as_dict()["merf"], "epsilon": suggested}}
    )
    assert not [w for w in planning.preview(ws_store, fits)["warnings"] if "will be refused" in w]


def test_a_stored_merf_plan_keeps_the_choices_the_steward_approves(ws_store):
    """The mechanism's choices are part of the stored plan (and so of its digest): what `release
    plan` and `release show` print is what was approved."""
    spec = ReleaseSpec.from_dict(
        {
            "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 100},
            "merf": {"epsilon": 2.0, "steps": 5, "n_features": 256, "perceptual_share": 0.3},
        }
    )
    rel = manager.create_plan(ws_store, spec, "alice")
    choices = rel.plan.mechanism_plan["choices"]
    assert choices == planning.preview(ws_store, spec)["choices"]
    assert "perceptual features: 30% of each image's vector" in choices[1]
    assert not choices[1].endswith("chosen by auto")  # set in the spec


def test_a_mechanism_that_reads_no_public_data_binds_none(ws_store):
    """DP-MERF declares no public data (`default_public` None): its plan names and binds none (it
    used to load and bind an unused digit set), and the run's inputs check against the signed plan
    with none; a spec that names a public set anyway still gets it bound, so edits to it are
    caught. (A whole run with none: the DP-MERF release of tests/release/test_release_e2e.py.)"""
    spec = ReleaseSpec.from_dict(
        {
            "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 20},
            "merf": {"epsilon": 2.0, "steps": 5, "n_features": 256},
        }
    )
    assert spec.public_source is None
    rel = manager.create_plan(ws_store, spec, "alice")
    assert (rel.plan.public_source, rel.plan.public_sha256) == (None, None)
    manager.approve(ws_store, rel.release_id, "alice", digest=rel.plan_digest)
    # what `release run` reads, checked against the signed plan: no public data, and no complaint
    *_, public = approval.bound_inputs(ws_store, manager.get_release(ws_store, rel.release_id))
    assert public is None
    named = ReleaseSpec.from_dict(
        {**spec.as_dict(), "merf": {**spec.as_dict()["merf"], "public": "builtin:uci-digits"}}
    )
    bound = manager.create_plan(ws_store, named, "alice").plan
    assert bound.public_source == "builtin:uci-digits" and len(bound.public_sha256 or "") == 64
