"""Memorisation (distance to closest record) and the k-anonymity attacks on crafted releases."""

from __future__ import annotations

import numpy as np
import pytest

from accounting.errors import DataFormatError
from audit.images import rms_nearest
from audit.kanon_attacks import check_kanon_attacks, compute_kanon_attacks
from audit.memorisation import run_memorisation
from audit.policy import AuditPolicy
from synth.kinds.datasets import load_source


@pytest.fixture(scope="module")
def data():
    sens = load_source("builtin:mnist5k").subset(np.arange(0, 4000, 10))  # 400 training images
    ho = load_source("builtin:mnist5k-heldout").subset(np.arange(0, 1000, 2))  # 500 held-out
    return sens, ho


def _dcr(images, sens, ho, policy=AuditPolicy(), features=False, artifacts=None):
    d, j = rms_nearest(images, sens.images)
    return run_memorisation(images, sens, ho, d, j, policy, artifacts, features=features)


def _kanon(reps, clusters, sens, ho, policy, features=False):
    return check_kanon_attacks(
        compute_kanon_attacks(reps, clusters, sens, ho, 4, policy, features), policy
    )


def test_independent_release_has_no_near_copies(data, tmp_path):
    sens, ho = data
    release = (
        load_source("builtin:mnist5k-heldout").subset(np.arange(1, 1000, 10)).images
    )  # unseen, 100
    res = _dcr(release, sens, ho.subset(np.arange(400)), artifacts=tmp_path)
    assert res.passed is True
    assert 0.25 < res.details["closer_to_train_fraction_pixel"] < 0.75
    assert (tmp_path / "nearest_pairs.png").stat().st_size > 1000


def test_noisy_training_copies_are_flagged(data):
    sens, ho = data
    rng = np.random.default_rng(0)
    copies = np.clip(
        sens.images[:30].astype(float) + rng.normal(0, 12, (30, 28, 28)), 0, 255
    ).astype(np.uint8)
    release = np.concatenate([copies, ho.images[:70]])
    res = _dcr(release, sens, ho.subset(np.arange(100, 500)))
    assert res.passed is False
    assert res.details["near_copy_count"] >= 28
    assert set(range(25)) <= set(res.details["near_copy_release_rows"])
    assert res.details["closer_to_train_fraction_pixel"] > 0.6


def test_feature_space_dcr_runs(data):
    sens, ho = data
    sens, ho = sens.subset(np.arange(40)), ho.subset(np.arange(40))  # references fully embedded
    release = sens.images[:16]  # exact copies: closer to training in feature space too
    res = _dcr(release, sens, ho, policy=AuditPolicy(feature_samples=40), features=True)
    fs = res.details["feature_space"]
    assert fs["closer_to_train_fraction"] > 0.8 and res.passed is False


def _averages(sens, k, rng):
    """A pixel-averaging k-anonymous release: clusters of k same-label records, one mean each."""
    clusters = []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(sens.labels == c))
        clusters += [idx[i : i + k] for i in range(0, len(idx) - k + 1, k)]
    reps = (
        np.stack([sens.images[c].astype(np.float64).mean(0) for c in clusters])
        .round()
        .astype(np.uint8)
    )
    return reps, clusters


def test_kanon_attacks_succeed_on_plain_averages(data):
    sens, ho = data
    reps, clusters = _averages(sens, 4, np.random.default_rng(0))
    mem, reid = _kanon(reps, clusters, sens, ho, AuditPolicy())
    assert mem.details["attack_precision"] > 0.8  # averages give their sources away
    assert reid.details["reid_rate"] > 0.5 and reid.details["chance"] == pytest.approx(4 / 400)
    strict = AuditPolicy(kanon_max_attack_precision=0.6, kanon_max_reid_rate=0.2)
    mem, reid = _kanon(reps, clusters, sens, ho, strict)
    assert mem.passed is False and reid.passed is False


def test_kanon_attack_at_chance_for_unrelated_release(data):
    sens, ho = data
    _, clusters = _averages(sens, 4, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    unrelated = ho.images[
        rng.choice(len(ho), len(clusters), replace=False)
    ]  # carries nothing of its "sources"
    shuffled = [clusters[i] for i in rng.permutation(len(clusters))]
    mem, reid = _kanon(
        unrelated, shuffled, sens, None, AuditPolicy(feature_samples=40), features=True
    )
    assert 0.3 < mem.details["precision_by_space"]["pixel"] < 0.7
    assert 0.2 < mem.details["precision_by_space"]["feature"] < 0.8
    assert mem.details["non_members"] == "sensitive records outside the cluster"
    assert reid.details["reid_rate"] < 0.1


def test_kanon_bad_clusters_raise(data):
    sens, ho = data
    reps, clusters = _averages(sens, 4, np.random.default_rng(0))
    with pytest.raises(DataFormatError):
        _kanon(reps, clusters[:-1], sens, ho, AuditPolicy())
    clusters[0] = np.array([0, 10_000])
    with pytest.raises(DataFormatError):
        _kanon(reps, clusters, sens, ho, AuditPolicy())
