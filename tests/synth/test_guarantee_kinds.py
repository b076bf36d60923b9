"""Guarantee kinds are declared by mechanisms and read by name nowhere in release/ or audit/."""

from __future__ import annotations

import pytest

from accounting.errors import InvalidParameterError
from synth import registry
from synth.registry import MechanismPlan


def test_a_plan_with_an_unknown_guarantee_kind_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="guarantee kind 'anonymous-ish'"):
        MechanismPlan(
            events=(), expected_count=1, output_shape=(8, 8), guarantee_kind="anonymous-ish"
        )


@pytest.mark.parametrize(
    ("kind", "label"),
    [
        ("dp", "differential privacy"),
        ("k-anonymity", "k-anonymity (no DP guarantee)"),
        ("empirical", "empirical de-identification (no DP guarantee)"),
    ],
)
def test_every_kind_has_words_and_only_dp_claims_dp(kind: str, label: str) -> None:
    assert registry.guarantee_label(kind) == label


def test_the_installed_mechanisms_describe_their_own_releases() -> None:
    dp = registry.describe(
        "privimage",
        {"vote_sigma": 2.0, "vote_pool": 8, "release_variations": 0},
        {"type": "dp", "epsilon_rdp": 1.0, "delta": 1e-5},
        100,
    )
    assert "PrivImage" in dp.what and "DP Gaussian vote" in dp.guarantee
    kanon = registry.describe("ksalsa", {"method": "ksalsa"}, {"type": "k-anonymity", "k": 5}, 20)
    assert "k = 5" in kanon.guarantee and "not* differential privacy" in kanon.guarantee
    assert "differential-privacy" not in kanon.tags


def test_a_mechanism_not_installed_here_gets_a_plain_account() -> None:
    about = registry.describe(
        "face-deid-v9", {}, {"type": "empirical", "description": "faces swapped"}, 3
    )
    assert "face-deid-v9" in about.what
    assert about.guarantee.startswith("empirical de-identification (no DP guarantee)")
    assert "differential-privacy" not in about.tags
