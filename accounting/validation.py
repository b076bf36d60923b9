"""Validation of every privacy number before it reaches an accountant.

dp-accounting and opacus accept some nonsense silently (a NaN sigma gives a NaN epsilon, a zero
sigma an infinite one); we refuse it up front with a message that says what to do.
"""
from __future__ import annotations

import math
from numbers import Integral, Real

from accounting.errors import InvalidParameterError


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}.")
    v = float(value)
    if math.isnan(v):
        raise InvalidParameterError(f"{name} is NaN; give a finite positive number.")
    if math.isinf(v):
        raise InvalidParameterError(f"{name} is infinite; give a finite positive number.")
    return v


def check_epsilon(value: object, name: str = "epsilon") -> float:
    v = _finite(name, value)
    if v <= 0:
        raise InvalidParameterError(f"{name} must be > 0, got {v}; a privacy budget of zero or less admits no release.")
    return v


def check_delta(value: object, name: str = "delta") -> float:
    v = _finite(name, value)
    if not 0 < v < 1:
        raise InvalidParameterError(
            f"{name} must be in (0, 1), got {v}; use a value well below 1/n, e.g. 1e-5 for 5,000 records."
        )
    return v


def check_sigma(value: object, name: str = "sigma") -> float:
    v = _finite(name, value)
    if v <= 0:
        raise InvalidParameterError(f"{name} (noise multiplier) must be > 0, got {v}; zero noise gives no privacy.")
    return v


def check_sensitivity(value: object, name: str = "sensitivity") -> float:
    v = _finite(name, value)
    if v <= 0:
        raise InvalidParameterError(f"{name} must be > 0, got {v}.")
    return v


def check_sample_rate(value: object, name: str = "sample rate q") -> float:
    v = _finite(name, value)
    if not 0 < v <= 1:
        raise InvalidParameterError(f"{name} must be in (0, 1], got {v}; it is batch size / dataset size.")
    return v


def check_count(value: object, name: str = "steps") -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise InvalidParameterError(f"{name} must be a whole number, got {value!r}.")
    v = _finite(name, value)
    if v != int(v) or v < 1:
        raise InvalidParameterError(f"{name} must be a whole number >= 1, got {value!r}.")
    return int(v)
