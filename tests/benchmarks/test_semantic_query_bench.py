"""The semantic-query benchmark's selection probability (its training part runs in `make bench`)."""

from __future__ import annotations

import numpy as np

from benchmarks.semantic_query_bench import correct_selection_rate


def _hist(own: float, rival: float) -> np.ndarray:
    """10 digit rows x 20 public classes: `own` on the diagonal, `rival` in one clothing column per row."""
    hist = np.zeros((10, 20))
    hist[np.arange(10), np.arange(10)] = own
    hist[np.arange(10), 10 + np.arange(10)] = rival
    return hist


def test_a_wide_margin_is_always_selected() -> None:
    assert correct_selection_rate(_hist(400, 10), 10.0, np.random.default_rng(0), draws=200) == 1.0


def test_a_clothing_class_that_outnumbers_the_digit_always_wins() -> None:
    assert correct_selection_rate(_hist(10, 400), 10.0, np.random.default_rng(0), draws=200) == 0.0


def test_a_narrow_margin_fails_sometimes_and_more_often_with_more_noise() -> None:
    rng = np.random.default_rng(1)
    quiet, loud = (correct_selection_rate(_hist(60, 40), s, rng, draws=2000) for s in (10.0, 20.0))
    assert 0.0 < loud < quiet < 1.0
