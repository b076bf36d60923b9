"""Per-example calibrated membership inference (offline LiRA / difficulty calibration): reference
models that never saw an example tell how hard it is, so a small member-only drop in loss stands out
even when difficulty varies far more across examples than membership moves it."""

import numpy as np
import pytest

from accounting.errors import InvalidParameterError
from audit.mia import calibrated_scores, check_mia, compute_mia, tpr_interval
from audit.policy import AuditPolicy
from synth.kinds.datasets import uci_digits


@pytest.fixture(scope="module")
def world():
    data = uci_digits()
    members, non = data.subset(np.arange(0, 1600, 2)), data.subset(np.arange(1, 1600, 2))
    rng = np.random.default_rng(0)
    keys = [im.tobytes() for im in data.images[:1600]]
    difficulty = dict(
        zip(keys, rng.gamma(2.0, 1.0, len(keys)))
    )  # per-example hardness, spread ~1.4
    member = {im.tobytes() for im in members.images}

    def model(trained_on: set, drop: float, seed: int):
        noise = np.random.default_rng(seed)

        def loss(images, labels):
            return np.array(
                [
                    difficulty[im.tobytes()]
                    - (drop if im.tobytes() in trained_on else 0.0)
                    + 0.05 * noise.standard_normal()
                    for im in images
                ]
            )

        return loss

    target = model(member, 0.3, 1)
    references = [model(set(), 0.0, 10 + r) for r in range(4)]  # e.g. trained on public data only
    return target, references, members, non


def test_calibration_exposes_what_the_raw_loss_attack_misses(world):
    target, refs, members, non = world
    policy = AuditPolicy(mia_samples=800)
    raw = compute_mia(target, members, non, 1e-5, policy)
    cal = compute_mia(target, members, non, 1e-5, policy, refs)
    assert set(raw.attacks) == {"loss"} and set(cal.attacks) == {"loss", "calibrated"}
    assert raw.attacks["loss"]["auc"] < 0.65 < 0.95 < cal.attacks["calibrated"]["auc"]
    assert cal.strongest == "calibrated"
    c = cal.attacks["calibrated"]
    assert c["tpr_1pct"]["ci"][0] <= c["tpr_1pct"]["tpr"] <= c["tpr_1pct"]["ci"][1]
    assert c["tpr_1pct"]["ci"][0] > 0.3 and c["epsilon_bound"]["eps_lower"] > 1.0
    result = check_mia(cal, claimed_epsilon=1.0, policy=policy, artifacts_dir=None)
    assert (
        result.passed is False
        and result.details["attack"] == "calibrated"
        and "CONTRADICTS" in result.summary
    )
    quiet = check_mia(raw, claimed_epsilon=1.0, policy=policy, artifacts_dir=None)
    assert "uncalibrated loss attack only" in quiet.summary


def test_single_reference_is_the_loss_difference_and_shapes_are_checked():
    target = np.array([1.0, 2.0, 3.0])
    assert calibrated_scores(target, np.array([[1.5, 2.0, 2.0]])).tolist() == [0.5, 0.0, -1.0]
    with pytest.raises(InvalidParameterError, match="one column per example"):
        calibrated_scores(target, np.ones((2, 4)))


def test_tpr_interval_at_low_fpr_counts_only_allowed_false_positives():
    non = np.arange(1000, dtype=float)  # scores 0..999
    mem = np.array([999.5, 998.5, 990.0, 10.0])
    out = tpr_interval(mem, non, 0.001, 0.95)  # one false positive allowed: threshold 998
    assert out["true_positives"] == 2 and out["tpr"] == 0.5 and out["ci"][0] < 0.5 < out["ci"][1]
