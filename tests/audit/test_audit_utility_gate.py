"""The utility gate of the default policy: a release no better than noise is not publishable."""

import numpy as np
import pytest

from audit.policy import AuditPolicy
from audit.utility import check_utility, compute_utility
from synth.kinds.datasets import load_source

FAST = dict(utility_train_samples=300, cnn_epochs=1)


@pytest.fixture(scope="module")
def data():
    return load_source("builtin:mnist5k"), load_source("builtin:mnist5k-heldout").subset(
        np.arange(0, 1000, 2)
    )


def test_default_gate_threshold_is_a_third_of_the_way_from_chance():
    p = AuditPolicy()
    assert p.min_utility_gain == pytest.approx(1 / 3) and p.utility_gated
    assert p.utility_threshold(0.1) == pytest.approx(0.4)
    assert AuditPolicy(min_downstream_accuracy=0.7).utility_threshold(0.1) == pytest.approx(0.7)
    assert AuditPolicy(min_utility_gain=None).utility_threshold(0.1) is None
    off = AuditPolicy.from_dict({"min_utility_gain": 0.0})  # TOML has no null: 0 turns the gate off
    assert off.utility_threshold(0.1) is None and not off.utility_gated


def test_noise_release_fails_the_default_gate(data):
    sens, ho = data
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (300, 28, 28), dtype=np.uint8)
    u = compute_utility(noise, rng.integers(0, 10, 300), None, ho, AuditPolicy(**FAST))
    r = check_utility(u, AuditPolicy(**FAST))
    assert r.passed is False and "NOT PUBLISHABLE" in r.summary
    assert (
        r.details["threshold"] == pytest.approx(u.chance + (1 - u.chance) / 3)
        and u.best < r.details["threshold"]
    )


def test_real_digits_pass_and_values_are_in_the_report(data):
    sens, ho = data
    policy = AuditPolicy(**FAST)
    real = sens.subset(np.arange(0, 4000, 13))  # every class (the set is sorted by label)
    u = compute_utility(real.images, real.labels, None, ho, policy)
    r = check_utility(u, policy)
    assert r.passed is True and r.details["best"] > 0.6
    assert f"best {u.best:.3f}" in r.summary and f"gate {r.details['threshold']:.3f}" in r.summary
    info = check_utility(u, AuditPolicy(min_utility_gain=None, **FAST))
    assert info.passed is None and "informational" in info.summary


def test_card_names_the_gate_as_an_uncharged_channel():
    from release.card import dataset_card

    rel = {
        "release_id": "r",
        "spec": {"release": {"dataset": "d", "mechanism": "ksalsa"}, "ksalsa": {}},
    }
    result = {
        "mechanism": "ksalsa",
        "guarantee": {"type": "k-anonymity", "k": 5},
        "parameters": {"method": "pca"},
    }
    ds = {"dataset_id": "d", "privacy_unit": "one image", "labels": [0, 1]}
    gated = dataset_card(rel, ds, result, 4, {"downstream_accuracy": "pass"})
    assert "Utility gate (uncharged channel)" in gated and "held-out set" in gated
    assert "uncharged channel" not in dataset_card(
        rel, ds, result, 4, {"downstream_accuracy": "info"}
    )
