import math

import pytest

from accounting.errors import InvalidParameterError
from accounting.events import DpSgd, GaussianQuery
from accounting.validation import (
    check_count,
    check_delta,
    check_epsilon,
    check_sample_rate,
    check_sigma,
)

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


# ------------------------------------------------------------------ numeric edges (each once crashed)
@pytest.mark.parametrize(
    "sigma,match", [(1e308, "above"), (1e-300, "below"), (1e-6, "below"), (5e6, "above")]
)
def test_extreme_noise_multipliers_refused_with_a_message(sigma, match):
    with pytest.raises(InvalidParameterError, match=match):
        DpSgd(0.01, sigma, 100)
    with pytest.raises(InvalidParameterError, match=match):
        GaussianQuery(sigma)


def test_gaussian_query_checks_the_ratio_not_the_std():
    assert GaussianQuery(0.5, sensitivity=0.01).noise_multiplier == pytest.approx(50)
    with pytest.raises(InvalidParameterError, match="sigma / sensitivity"):
        GaussianQuery(1e-3, sensitivity=1.0)
    with pytest.raises(InvalidParameterError):
        GaussianQuery(1e308, sensitivity=1e-300)  # the ratio overflows


@pytest.mark.parametrize("value", [1e308, 1001.0])
def test_absurd_epsilon_refused(value):
    with pytest.raises(InvalidParameterError, match="nothing is protected"):
        check_epsilon(value)


def test_absurd_counts_refused():
    with pytest.raises(InvalidParameterError, match="realistic"):
        check_count(1e308)
    with pytest.raises(InvalidParameterError, match="realistic"):
        DpSgd(0.01, 1.0, 10**12)


def test_budget_plan_numeric_edges_are_clear_errors(store):
    from typer.testing import CliRunner

    from accounting import ledger
    from release.cli import app

    ledger.register_dataset(
        store,
        name="base",
        source="s",
        fingerprint="f",
        record_count=1000,
        labels=[0, 1],
        image_shape=[8, 8],
        epsilon_cap=5,
        delta_cap=1e-5,
    )

    def plan(*args):
        r = CliRunner().invoke(
            app,
            [
                "--workspace",
                str(store.workspace.root),
                "budget",
                "plan",
                "--sample-rate",
                "0.01",
                "--steps",
                "100",
                *args,
            ],
        )
        assert isinstance(r.exception, InvalidParameterError), (args, r.exception)
        return str(r.exception)

    assert "above" in plan("--sigma", "1e308", "--delta", "1e-5")
    assert "below" in plan("--sigma", "1e-300", "--delta", "1e-5")
    assert "nothing is protected" in plan("--epsilon", "1e308", "--delta", "1e-5")
    assert "delta cap" in plan("--sigma", "1", "--dataset", "base", "--delta", "0.1")


def test_loose_target_gets_the_least_accepted_noise():
    from accounting.calibration import calibrate_dpsgd_sigma
    from accounting.epsilon import epsilon_rdp
    from accounting.validation import MIN_NOISE_MULTIPLIER

    sigma = calibrate_dpsgd_sigma(999, 1e-5, 0.01, 10)
    assert sigma == MIN_NOISE_MULTIPLIER and epsilon_rdp([DpSgd(0.01, sigma, 10)], 1e-5) <= 999


def test_pld_skipped_beyond_any_budget():
    import time

    from accounting.epsilon import PLD_MAX_EPSILON, epsilon_report

    t = time.perf_counter()
    r = epsilon_report([DpSgd(1.0, 0.1, 1000)], 1e-5)  # PLD alone took 42 s and 4.6 GB here
    assert time.perf_counter() - t < 5
    assert r.epsilon_rdp > PLD_MAX_EPSILON and r.epsilon_pld == r.epsilon_rdp
