"""Calibration never overshoots the target, prior spend included (hypothesis over many settings)."""

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from accounting.calibration import calibrate_dpsgd_sigma, calibrate_gaussian_sigma, max_dpsgd_steps
from accounting.epsilon import epsilon_rdp
from accounting.errors import BudgetExceededError
from accounting.events import DpSgd, GaussianQuery
from accounting.validation import MIN_NOISE_MULTIPLIER


# Each example is a whole search (~30 accountant evaluations, about a second); the prior that
# leaves no room is pinned as an example, so every run takes that branch too.
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(target=0.5, q=0.01, steps=100, prior_sigma=5.0)  # the prior alone has epsilon 0.79
@given(
    target=st.floats(0.5, 12),
    q=st.floats(0.001, 0.5),
    steps=st.integers(1, 3000),
    prior_sigma=st.one_of(st.none(), st.floats(5, 60)),
)
def test_sigma_never_overshoots_and_is_near_tight(target, q, steps, prior_sigma):
    delta = 1e-5
    prior = [] if prior_sigma is None else [GaussianQuery(prior_sigma)]
    if epsilon_rdp(prior, delta) >= target:
        with pytest.raises(BudgetExceededError):
            calibrate_dpsgd_sigma(target, delta, q, steps, prior=prior)
        return
    sigma = calibrate_dpsgd_sigma(target, delta, q, steps, prior=prior)
    assert epsilon_rdp(prior + [DpSgd(q, sigma, steps)], delta) <= target
    # not wastefully large: 1% less noise would overshoot (or sigma is at the bracket's floor)
    if sigma > MIN_NOISE_MULTIPLIER * 1.02:
        assert epsilon_rdp(prior + [DpSgd(q, sigma * 0.99, steps)], delta) > target


@settings(max_examples=8, deadline=None)
@given(target=st.floats(0.5, 10), q=st.floats(0.002, 0.2), sigma=st.floats(0.6, 3))
def test_max_steps_is_the_largest_that_fits(target, q, sigma):
    delta = 1e-5
    t = max_dpsgd_steps(target, delta, q, sigma, limit=200_000)
    if t == 0:
        assert epsilon_rdp([DpSgd(q, sigma, 1)], delta) > target
        return
    assert epsilon_rdp([DpSgd(q, sigma, t)], delta) <= target
    if t < 200_000:
        assert epsilon_rdp([DpSgd(q, sigma, t + 1)], delta) > target


def test_gaussian_query_sigma_scales_with_sensitivity():
    s1 = calibrate_gaussian_sigma(1.0, 1e-5, sensitivity=1.0)
    s3 = calibrate_gaussian_sigma(1.0, 1e-5, sensitivity=3.0)
    assert s3 == pytest.approx(3 * s1, rel=1e-4)
    assert epsilon_rdp([GaussianQuery(s3, 3.0)], 1e-5) <= 1.0


def test_no_room_left_is_a_clear_error():
    with pytest.raises(BudgetExceededError, match="prior spend"):
        calibrate_dpsgd_sigma(1.0, 1e-5, 0.01, 100, prior=[GaussianQuery(0.5)])


def _recorder():
    calls = []
    return calls, lambda stage, done, total: calls.append((stage, done, total))


def test_calibration_reports_each_accountant_evaluation_and_ends_complete():
    from accounting.calibration import reporting

    calls, progress = _recorder()
    # values no other test calibrates: a process remembers what it solved (the last test below)
    sigma = calibrate_dpsgd_sigma(3.01, 1e-5, 0.0101, 501, progress=progress)
    assert sigma == calibrate_dpsgd_sigma(3.01, 1e-5, 0.0101, 501)  # reporting changes nothing
    assert {c[0] for c in calls} == {"calibrating the noise"}
    dones = [c[1] for c in calls]
    assert dones[0] == 0 and dones == sorted(dones) and len(calls) > 10  # a live bar, not one jump
    assert calls[-1][1] == calls[-1][2] == dones[-2]  # ends at its total: the clock stops
    seen, block = _recorder()
    with reporting(block):  # a mechanism's plan calibrates without knowing about progress
        max_dpsgd_steps(3.0, 1e-5, 0.01, 1.0)
    assert seen[-1][0] == "calibrating the steps" and seen[-1][1] == seen[-1][2] > 0
    n = len(seen)
    max_dpsgd_steps(3.0, 1e-5, 0.01, 1.0)
    assert len(seen) == n  # outside the block: not reported


def test_a_calibration_solved_once_is_remembered_and_prior_spend_makes_sigma_larger():
    """The same question (target, delta, q, steps, prior, extra) gets the same answer without a
    second search; another prior is another question, and more spent before means more noise."""
    prior = [GaussianQuery(17.0)]
    calls: list = []
    first = calibrate_dpsgd_sigma(2.345, 1e-5, 0.02, 300, prior=prior)
    again = calibrate_dpsgd_sigma(
        2.345, 1e-5, 0.02, 300, prior=prior, progress=lambda *a: calls.append(a)
    )
    assert again == first and calls[-1] == ("calibrating the noise", 1, 1)
    assert epsilon_rdp([*prior, DpSgd(0.02, first, 300)], 1e-5) <= 2.345
    # another prior is another question: no prior (less spent) and a DP-SGD prior (more spent)
    free = calibrate_dpsgd_sigma(2.345, 1e-5, 0.02, 300)
    used = calibrate_dpsgd_sigma(2.345, 1e-5, 0.02, 300, prior=[DpSgd(0.01, 1.0, 300)])
    assert free < first < used
