"""Validation of every privacy number before it reaches an accountant.

dp-accounting and opacus accept some nonsense silently (a NaN sigma gives a NaN epsilon, a zero
sigma an infinite one); we refuse it up front with a message that says what to do.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from accounting.errors import InvalidParameterError

# Beyond these the numbers mean nothing and the accountants misbehave (overflow, division by zero,
# or a PLD grid of petabytes), so they are refused with a message instead.
# e**epsilon overflows a float near 710; no release is private at such a budget
MAX_EPSILON = 1000.0
MIN_NOISE_MULTIPLIER = 0.1  # one Gaussian query at 0.1 already costs epsilon ~ 96 (delta 1e-5)
MAX_NOISE_MULTIPLIER = 1e6  # epsilon is 0 to float precision well before this
MAX_COUNT = 10**9


def finite(name: str, value: object, wanted: str = "a finite positive number") -> float:
    """`value` as a finite float; otherwise an error saying what `name` must be (`wanted`)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidParameterError(f"{name} must be {wanted}, got {value!r}.")
    v = float(value)
    if math.isnan(v):
        raise InvalidParameterError(f"{name} is NaN; give {wanted}.")
    if math.isinf(v):
        raise InvalidParameterError(f"{name} is infinite; give {wanted}.")
    return v


def check_epsilon(value: object, name: str = "epsilon") -> float:
    v = finite(name, value)
    if v <= 0:
        raise InvalidParameterError(
            f"{name} must be > 0, got {v}; a privacy budget of zero or less admits no release."
        )
    if v > MAX_EPSILON:
        raise InvalidParameterError(
            f"{name} {v:g} is above {MAX_EPSILON:g}: at such a budget nothing is protected "
            "(e^epsilon overflows). Useful budgets are below about 10."
        )
    return v


def check_delta(value: object, name: str = "delta") -> float:
    v = finite(name, value)
    if not 0 < v < 1:
        raise InvalidParameterError(
            f"{name} must be in (0, 1), got {v}; use a value "
            "well below 1/n, e.g. 1e-5 for 5,000 records."
        )
    return v


def check_sigma(value: object, name: str = "sigma") -> float:
    """A noise multiplier (noise std / L2 sensitivity), within [MIN_NOISE_MULTIPLIER,
    MAX_NOISE_MULTIPLIER]."""
    v = finite(name, value)
    if v <= 0:
        raise InvalidParameterError(
            f"{name} (noise multiplier) must be > 0, got {v}; zero noise gives no privacy."
        )
    if v < MIN_NOISE_MULTIPLIER:
        raise InvalidParameterError(
            f"{name} {v:g} is below {MIN_NOISE_MULTIPLIER:g} times the "
            "sensitivity: so little noise gives no useful privacy (epsilon in "
            "the hundreds or more). Use a noise multiplier of about 0.5 or more, "
            "or ask `privrelease budget plan --epsilon E` for the one that fits."
        )
    if v > MAX_NOISE_MULTIPLIER:
        raise InvalidParameterError(
            f"{name} {v:g} is above {MAX_NOISE_MULTIPLIER:g} times the "
            "sensitivity: the output would be pure noise. Use less noise "
            "(`privrelease budget plan --epsilon E` finds the smallest that fits)."
        )
    return v


def check_sensitivity(value: object, name: str = "sensitivity") -> float:
    v = finite(name, value)
    if v <= 0:
        raise InvalidParameterError(f"{name} must be > 0, got {v}.")
    return v


def check_sample_rate(value: object, name: str = "sample rate q") -> float:
    v = finite(name, value)
    if not 0 < v <= 1:
        raise InvalidParameterError(
            f"{name} must be in (0, 1], got {v}; it is batch size / dataset size."
        )
    return v


def check_count(value: object, name: str = "steps") -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise InvalidParameterError(f"{name} must be a whole number, got {value!r}.")
    v = finite(name, value)
    if v != int(v) or v < 1:
        raise InvalidParameterError(f"{name} must be a whole number >= 1, got {value!r}.")
    if v > MAX_COUNT:
        raise InvalidParameterError(
            f"{name} {value!r} is above {MAX_COUNT:,}; give a realistic count."
        )
    return int(v)
