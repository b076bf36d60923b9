"""A whole release, end to end, on a small slice of MNIST: plan -> approve -> run -> audit -> publish ->
verify offline; plus the budget and trail afterwards. Tiny presets: the point is the wiring, not quality."""

import json
import math

import numpy as np
import pytest

from accounting import ledger, trail
from accounting.errors import PermissionDeniedError
from release import artifacts, keys, manager
from release.bundle import read_bundle_data
from release.data import register_from_source
from release.spec import ReleaseSpec
from release.verify import verify_bundle
from synth.kinds.datasets import load_source

POLICY = {
    "mia_samples": 40,
    "feature_samples": 80,
    "fid_samples": 80,
    "utility_train_samples": 120,
    "cnn_epochs": 1,
    "mia_max_auc": 0.9,
    "mia_max_tpr_at_1pct_fpr": 0.5,
}


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """240 sensitive and 100 held-out MNIST images (disjoint), as user .npz files."""
    root = tmp_path_factory.mktemp("data")
    train, held = load_source("builtin:mnist5k"), load_source("builtin:mnist5k-heldout")
    rng = np.random.default_rng(0)
    ti, hi = rng.choice(len(train), 240, replace=False), rng.choice(len(held), 100, replace=False)
    np.savez(root / "train.npz", images=train.images[ti], labels=train.labels[ti])
    np.savez(root / "heldout.npz", images=held.images[hi], labels=held.labels[hi])
    return root


def _setup(store, small_data):
    keys.create_identity(store, "alice", "steward")
    keys.create_identity(store, "carol", "consumer")
    keys.ensure_release_key(store.workspace)
    register_from_source(
        store,
        "digits",
        str(small_data / "train.npz"),
        epsilon_cap=10.0,
        delta_cap=1e-4,
        labels="0-9",
    )


def _release(store, spec):
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(
        store,
        rel.release_id,
        "alice",
        digest=rel.plan_digest,
        acknowledge_non_dp=rel.plan.requires_acknowledgement,
    )
    stages = []
    rel = manager.run_release(store, rel.release_id, "alice", lambda s, d, t: stages.append(s))
    assert stages, "long work reports progress"
    return rel


@pytest.mark.slow
def test_privimage_release_end_to_end(store, small_data):
    _setup(store, small_data)
    spec = {
        "release": {
            "dataset": "digits",
            "mechanism": "privimage",
            "n_images": 30,
            "heldout": str(small_data / "heldout.npz"),
        },
        "privimage": {"epsilon": 6.0, "preset": "tiny", "public": "builtin:uci-digits"},
        # the tiny preset tests the wiring, not quality: its samples are no better than noise, so the
        # utility gate (tested on its own) is informational here
        "policy": {**POLICY, "min_utility_gain": None},
    }
    rel = _release(store, spec)
    rid = rel.release_id
    assert rel.state == "checked"
    b = ledger.budget(store, "digits")
    assert [c.state for c in b.charges] == ["committed"] and b.spent.epsilon_rdp <= 6.0 + 1e-9
    g = rel.result.guarantee
    assert g["type"] == "dp" and g["epsilon_rdp"] == pytest.approx(b.spent.epsilon_rdp)
    with pytest.raises(PermissionDeniedError):
        manager.publish(store, rid, "carol")
    from audit import load_report

    report = load_report(store, rid)
    if not report.passed:
        pytest.fail(
            "tiny release failed its audit: " + "; ".join(c.summary for c in report.failures)
        )
    rel = manager.publish(store, rid, "alice")
    bundle = rel.result.bundle
    v = verify_bundle(bundle["tarball"], keys.public_key_path(store.workspace, "release"))
    assert v.ok, v.problems
    images, labels, ids = read_bundle_data(bundle["path"])
    assert len(images) == 30 and set(labels) <= set(range(10))
    # the consumer bundle carries verdicts only: no attack details, no sensitive-data hashes
    pred = v.predicate
    assert set(pred["audit_verdicts"].values()) <= {"pass", "fail", "info"}
    assert (
        pred["released_image_count"] == 30 and "record_count" not in pred
    )  # not the dataset's 240 records
    text = json.dumps(pred)
    ds = ledger.get_dataset(store, "digits")
    assert ds.fingerprint not in text and "auc" not in text.lower()
    assert pred["ledger_position"]["trail_head_sha256"] in {
        e["entry_hash"] for e in trail.entries(store)
    }
    card = (
        artifacts.release_dir(store, rid).parent.parent / "bundles" / rid / "README.md"
    ).read_text()
    assert "epsilon by RDP" in card and "dataset size is treated as public" in card
    assert trail.verify(store).ok
    assert manager.list_releases(store, keys.get_identity(store, "carol"))[0].release_id == rid


@pytest.mark.slow
def test_ksalsa_release_end_to_end(store, small_data):
    _setup(store, small_data)
    spec = {
        "release": {
            "dataset": "digits",
            "mechanism": "ksalsa",
            "heldout": str(small_data / "heldout.npz"),
        },
        "ksalsa": {"k": 5, "preset": "tiny", "public": "builtin:uci-digits"},
        "policy": POLICY,
    }
    rel = _release(store, spec)
    assert rel.state == "checked"
    assert rel.result.guarantee["type"] == "k-anonymity"
    images, labels, dist = artifacts.load_release_data(store, rel.release_id)
    assert len(images) == 240 // 5 and dist.shape == (48, 10)
    b = ledger.budget(store, "digits")
    assert b.dp_void and math.isinf(b.spent.epsilon_rdp)


@pytest.mark.slow
def test_a_dp_release_is_compared_with_the_datasets_merf_release_in_its_card(store, small_data):
    """A fast DP-MERF release first, then a PrivImage release of the same data: the audit compares
    the two on the same held-out images, and the PrivImage card says when it does not beat it."""
    _setup(store, small_data)
    heldout = str(small_data / "heldout.npz")
    merf = _release(
        store,
        {
            "release": {
                "dataset": "digits",
                "mechanism": "merf",
                "n_images": 200,
                "heldout": heldout,
            },
            # enough budget and steps that DP-MERF's digits beat chance in every draw (at epsilon
            # 3 with 150 steps one CI run in several drew chance-level digits, 0.09)
            "merf": {"epsilon": 5.0, "steps": 400, "n_features": 1000},
            "policy": {**POLICY, "min_utility_gain": None},
        },
    )
    assert merf.state == "checked"
    spec = {
        "release": {
            "dataset": "digits",
            "mechanism": "privimage",
            "n_images": 30,
            "heldout": heldout,
        },
        "privimage": {"epsilon": 8.0, "preset": "tiny", "public": "builtin:uci-digits"},
        "policy": {**POLICY, "min_utility_gain": None},
    }
    rel = _release(store, spec)
    from audit import load_report

    report = load_report(store, rel.release_id)
    (check,) = [r for r in report.results if r.name == "baseline_comparison"]
    assert check.kind == "comparison" and check.details["baselines"][0]["release_id"] == (
        merf.release_id
    )
    assert check.passed is False  # the tiny preset's noise does not beat DP-MERF's digits
    assert report.passed  # a comparison informs; it never blocks publication
    rel = manager.publish(store, rel.release_id, "alice")
    card = (
        artifacts.release_dir(store, rel.release_id).parent.parent
        / "bundles"
        / rel.release_id
        / "README.md"
    ).read_text()
    assert "Below its baseline" in card
