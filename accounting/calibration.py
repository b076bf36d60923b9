"""Conservative calibration: the noise (or step count) whose *composed* history, prior spend
included, has RDP epsilon <= target. dp-accounting's calibrate_dp_mechanism does the search; we
check its answer with a fresh accountant and step towards safety if rounding ever overshoots.

A search takes about 30 accountant evaluations (seconds each on a slow CPU): each is reported to a
progress(stage, done, total) callback, passed in or set for a block with `reporting(progress)`."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import dp_accounting
from dp_accounting import dp_event as dpe

from accounting.epsilon import epsilon_rdp, quiet_absl, rdp_accountant
from accounting.errors import BudgetExceededError, InvalidParameterError
from accounting.events import DpSgd, GaussianQuery, MechanismEvent, compose
from accounting.validation import (
    MIN_NOISE_MULTIPLIER,
    check_count,
    check_delta,
    check_epsilon,
    check_sample_rate,
    check_sensitivity,
)

MAX_SIGMA = 1e4
# brentq over the bracket: ~30 evaluations (a progress bar's initial total)
EXPECTED_EVALUATIONS = 32

# progress(stage, done, total), as synth.progress.ProgressFn
Progress = Callable[[str, int, int], None]
_PROGRESS: ContextVar[Progress | None] = ContextVar("calibration_progress", default=None)


@contextmanager
def reporting(progress: Progress) -> Iterator[None]:
    """Report every calibration in this block (e.g. inside a mechanism's plan) to `progress`."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


class _Counter:
    """Counts accountant evaluations for a progress bar whose total grows if the search runs
    long."""

    def __init__(self, stage: str, progress: Progress | None) -> None:
        self.stage, self.progress, self.done = stage, progress or _PROGRESS.get(), 0
        self._report(EXPECTED_EVALUATIONS)

    def _report(self, total: int) -> None:
        if self.progress is not None:
            self.progress(self.stage, self.done, total)

    def tick(self) -> None:
        self.done += 1
        self._report(max(EXPECTED_EVALUATIONS, self.done + 1))

    def finish(self) -> None:
        self._report(self.done)


def _history_event(
    prior: Iterable[MechanismEvent],
    make: Callable[[float], Sequence[MechanismEvent]],
    counter: _Counter | None = None,
):
    prior = list(prior)

    def event(param: float) -> dpe.DpEvent:
        if counter is not None:
            counter.tick()
        return compose(prior + list(make(param)))

    return event


def _check_room(prior: list[MechanismEvent], target: float, delta: float) -> None:
    spent = epsilon_rdp(prior, delta)
    if spent >= target:
        raise BudgetExceededError(
            f"The prior spend already has epsilon {spent:.4g} (RDP) >= target {target:g}; no "
            "amount of noise fits. Raise the target epsilon (within the dataset cap) or release "
            "nothing more from this dataset."
        )


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    make_events: Callable[[float], Sequence[MechanismEvent]],
    prior: Iterable[MechanismEvent] = (),
    progress: Progress | None = None,
) -> float:
    """Smallest noise parameter x such that epsilon_rdp(prior + make_events(x)) <= target."""
    target, delta = check_epsilon(target_epsilon, "target epsilon"), check_delta(delta)
    prior = list(prior)
    _check_room(prior, target, delta)
    counter = _Counter("calibrating the noise", progress)
    try:
        return _search_noise(target, delta, _history_event(prior, make_events, counter))
    finally:
        counter.finish()


def _search_noise(target: float, delta: float, event_of: Callable[[float], dpe.DpEvent]) -> float:
    if epsilon_rdp(event_of(MAX_SIGMA), delta) > target:
        raise BudgetExceededError(
            f"Even noise {MAX_SIGMA:g} times the sensitivity does not keep "
            f"epsilon <= {target:g}; the remaining budget is too small for "
            "this run. Raise the target (within the cap) or run fewer steps."
        )
    if epsilon_rdp(event_of(MIN_NOISE_MULTIPLIER), delta) <= target:
        return (
            MIN_NOISE_MULTIPLIER  # the least noise accepted already fits: the target is very loose
        )
    with quiet_absl():
        x = float(
            dp_accounting.calibrate_dp_mechanism(
                rdp_accountant,
                event_of,
                target,
                delta,
                bracket_interval=dp_accounting.ExplicitBracketInterval(
                    MIN_NOISE_MULTIPLIER, MAX_SIGMA
                ),
                tol=1e-6,
            )
        )
    for _ in range(100):  # guard against rounding at the bracket's edge: never overshoot
        if epsilon_rdp(event_of(x), delta) <= target:
            break
        x *= 1 + 1e-6
    return x


# Calibrations already done in this process, by their inputs: a search is deterministic and takes
# seconds (each of its ~30 evaluations composes the whole history), and the same question comes
# back (a plan, then the plan of the same spec by the dashboard, the bisection of the largest target
# that fits, a preview then the plan).
_SOLVED: OrderedDict[str, float] = OrderedDict()
_SOLVED_MAX = 256


_SOLVED_LOCK = threading.Lock()


def _remembered(
    key: str, stage: str, progress: Progress | None, solve: Callable[[], float]
) -> float:
    with _SOLVED_LOCK:
        known = _SOLVED.get(key)
    if known is not None:
        done = _Counter(stage, progress)
        done.done = 1
        done.finish()  # the bar still ends complete
        return known
    value = solve()
    with _SOLVED_LOCK:
        _SOLVED[key] = value
        if len(_SOLVED) > _SOLVED_MAX:
            _SOLVED.popitem(last=False)
    return value


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def calibrate_dpsgd_sigma(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    prior: Iterable[MechanismEvent] = (),
    extra: Sequence[MechanismEvent] = (),
    progress: Progress | None = None,
) -> float:
    """Noise multiplier for DP-SGD (plus `extra` events of the same run, e.g. a DP query)."""
    q, t = check_sample_rate(sample_rate), check_count(steps)
    prior, extra = list(prior), list(extra)
    return _remembered(
        _key("dpsgd", target_epsilon, delta, q, t, compose(prior), compose(extra)),
        "calibrating the noise",
        progress,
        lambda: calibrate_noise(
            target_epsilon, delta, lambda s: [*extra, DpSgd(q, s, t)], prior, progress
        ),
    )


def calibrate_gaussian_sigma(
    target_epsilon: float,
    delta: float,
    sensitivity: float = 1.0,
    prior: Iterable[MechanismEvent] = (),
    progress: Progress | None = None,
) -> float:
    """Noise standard deviation for one Gaussian query with the given L2 sensitivity."""
    s = check_sensitivity(sensitivity)
    return s * calibrate_noise(
        target_epsilon, delta, lambda m: [GaussianQuery(m * s, s)], prior, progress
    )


def max_dpsgd_steps(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    noise_multiplier: float,
    prior: Iterable[MechanismEvent] = (),
    limit: int = 10_000_000,
    progress: Progress | None = None,
) -> int:
    """Largest step count whose composed history stays <= target; 0 if not even one step fits."""
    target, delta = check_epsilon(target_epsilon, "target epsilon"), check_delta(delta)
    counter = _Counter("calibrating the steps", progress)
    try:
        return _search_steps(
            target,
            delta,
            _history_event(
                prior, lambda t: [DpSgd(sample_rate, noise_multiplier, int(t))], counter
            ),
            limit,
        )
    finally:
        counter.finish()


def _search_steps(
    target: float, delta: float, event_of: Callable[[float], dpe.DpEvent], limit: int
) -> int:
    if epsilon_rdp(event_of(1), delta) > target:
        return 0
    if epsilon_rdp(event_of(limit), delta) <= target:
        return limit
    with quiet_absl():
        t = int(
            dp_accounting.calibrate_dp_mechanism(
                rdp_accountant,
                event_of,
                target,
                delta,
                bracket_interval=dp_accounting.ExplicitBracketInterval(1, limit),
                discrete=True,
            )
        )
    while t > 0 and epsilon_rdp(event_of(t), delta) > target:
        t -= 1
    if t < 1:
        raise InvalidParameterError(
            "Calibration failed to find a step count; check the parameters."
        )
    return t
