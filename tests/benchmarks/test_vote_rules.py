"""benchmarks.vote_rules: the rules it compares are the product's vote with its own options."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.vote_rules import parse_rule
from synth.mechanisms.privimage.vote import nearest_candidate_votes, pixel_features


def test_rules_name_the_space_and_the_neighbours() -> None:
    assert parse_rule("pixel") == (pixel_features, 1, 1000)
    assert parse_rule("pixel+k4") == (pixel_features, 4, 1000)
    assert parse_rule("pixel+k4+w2000") == (pixel_features, 4, 2000)
    featurize, k, winners = parse_rule("blurred@0.7+k2")
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
    blurred, _, _ = parse_rule("blurred")
    args = (sens, np.array(pos), cand, np.array(cpos))
    assert nearest_candidate_votes(*args).tolist() == [1, 0]
    assert nearest_candidate_votes(*args, blurred).tolist() == [0, 1]
    assert np.array_equal(blurred(cand)[1:], blurred(cand[1:]))  # one image's features alone
