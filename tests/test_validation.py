import math

import pytest

from accounting.errors import InvalidParameterError
from accounting.events import DpSgd, GaussianQuery
from accounting.validation import check_count, check_delta, check_epsilon, check_sample_rate, check_sigma

BAD_POSITIVE = [math.nan, math.inf, -math.inf, -1.0, 0.0, "1", None, True]


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_epsilon_and_sigma_reject_non_positive_or_non_finite(value):
    with pytest.raises(InvalidParameterError):
        check_epsilon(value)
    with pytest.raises(InvalidParameterError):
        check_sigma(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1e-5, 1.0, 2.0])
def test_delta_must_be_in_open_unit_interval(value):
    with pytest.raises(InvalidParameterError, match="delta"):
        check_delta(value)


@pytest.mark.parametrize("value", [math.nan, 0.0, -0.1, 1.0001, math.inf])
def test_sample_rate_outside_zero_one(value):
    with pytest.raises(InvalidParameterError, match="sample rate"):
        check_sample_rate(value)


def test_sample_rate_one_is_allowed():
    assert check_sample_rate(1.0) == 1.0


@pytest.mark.parametrize("value", [0, -3, 2.5, math.nan])
def test_counts_are_positive_integers(value):
    with pytest.raises(InvalidParameterError):
        check_count(value)


def test_events_validate_on_construction():
    with pytest.raises(InvalidParameterError, match="noise multiplier"):
        DpSgd(0.01, math.nan, 10)
    with pytest.raises(InvalidParameterError, match="sample rate"):
        DpSgd(1.5, 1.0, 10)
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        GaussianQuery(1.0, sensitivity=-2)


def test_messages_say_what_to_do():
    with pytest.raises(InvalidParameterError) as info:
        check_delta(1.0)
    assert "1e-5" in str(info.value) or "1/n" in str(info.value)
