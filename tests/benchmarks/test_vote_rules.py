"""benchmarks.vote_rules: the rules it compares are the product's vote with its own options."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.vote_rules import parse_rule
from synth.mechanisms.privimage.vote import nearest_candidate_votes, pixel_features


def test_rules_name_the_space_and_the_neighbours() -> None:
    assert parse_rule("pixel") == (pixel_features, 1, 1000, 2.0, 3)
    assert parse_rule("pixel+k4") == (pixel_features, 4, 1000, 2.0, 3)
    assert parse_rule("pixel+k4+w2000") == (pixel_features, 4, 2000, 2.0, 1)
    featurize, k, winners, *_ = parse_rule("blurred@0.7+k2")
    assert k == 2 and winners == 1000 and featurize is not pixel_features
    with pytest.raises(SystemExit, match="unknown rule 'cosine'"):
        parse_rule("cosine")
    with pytest.raises(SystemExit, match="unknown rule 'pixel\\+x2'"):
        parse_rule("pixel+x2")
    with pytest.raises(SystemExit, match="W must divide 4000"):
        parse_rule("pixel+w3000")


def test_blurred_rule_prefers_a_stroke_one_pixel_off_to_a_blank() -> None:
    """What the blurred rule was for: pixel L2 counts a stroke one pixel off as two wrong strokes."""
    sens = np.zeros((1, 28, 28), dtype=np.uint8)
    sens[0, 4:24, 12] = 255
    cand, pos, cpos = np.stack([np.zeros((28, 28), np.uint8), np.roll(sens[0], 1, 1)]), [0], [0, 0]
    blurred, *_ = parse_rule("blurred")
    args = (sens, np.array(pos), cand, np.array(cpos))
    assert nearest_candidate_votes(*args).tolist() == [1, 0]
    assert nearest_candidate_votes(*args, blurred).tolist() == [0, 1]
    assert np.array_equal(blurred(cand)[1:], blurred(cand[1:]))  # one image's features alone


def test_a_rule_may_set_the_vote_noise_and_bad_values_are_refused() -> None:
    assert parse_rule("pixel+k4")[3] == 2.0  # the product's sigma unless the rule says
    assert parse_rule("pixel+k4+s1.75") == (pixel_features, 4, 1000, 1.75, 3)
    for bad in ("pixel+s0", "pixel+s1e308", "pixel+snan", "pixel+s-1", "pixel+k1.5"):
        with pytest.raises(SystemExit, match="unknown rule|the vote noise S must be in"):
            parse_rule(bad)


def test_a_rule_may_release_more_variations_of_each_winner() -> None:
    """+vV: V variations of each of the last round's winners instead of 4,000 / W - 1."""
    assert parse_rule("pixel+k4+s1.75+v7") == (pixel_features, 4, 1000, 1.75, 7)
    assert parse_rule("pixel+w2000+v0")[2:] == (2000, 2.0, 0)
    with pytest.raises(SystemExit, match="V is at most 15"):
        parse_rule("pixel+v16")
    for bad in ("pixel+v1.5", "pixel+v-1", "pixel+vx"):
        with pytest.raises(SystemExit, match="unknown rule"):
            parse_rule(bad)


def test_release_seeds_seed_zero_is_the_audits_own_cnn_number() -> None:
    """benchmarks.release_seeds re-scores a release as the audit does: its seed 0 is the number
    the audit reported, so the other seeds say where that one draw lies."""
    from audit.policy import AuditPolicy
    from audit.utility import compute_utility
    from benchmarks.release_seeds import seed_scores
    from synth.kinds.datasets import BUILTINS

    real, held = BUILTINS["builtin:mnist5k"](), BUILTINS["builtin:mnist5k-heldout"]()
    images, labels = real.images[:1000], real.labels[:1000]
    policy = AuditPolicy(utility_train_samples=1000, cnn_epochs=2, seed=0)
    audit = compute_utility(images, labels, None, held, policy).release["cnn"]
    scores = seed_scores(images, labels, held.images, held.labels, seeds=2, epochs=2)
    # seed 0 is the audit's draw, seed 1 another; and it learnt (chance is 0.1)
    assert scores[0] == audit and scores[1] != audit and 0.2 < audit <= 1.0
