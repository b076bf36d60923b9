"""The largest target epsilon whose events a dataset's cap still admits, after its history.

The shape of dp-accounting's `calibrate_dp_mechanism` (mechanism_calibration.py): a function from a
parameter (here the mechanism's target epsilon) to the events it would charge, and a bracketed
search over that parameter. The bracket is (what the history has spent, the target asked for): a
target at or below the spend fits nothing. The test is the ledger's own stop rule, the cap's privacy
filter (accounting.filter) on the running RDP curve of the history plus the events. Bisection rather
than a root finder, because the filter's epsilon is monotone in the target but not smooth: a plan's
structure can change with it. Pure: reads no store and no data; `events_at` says what a target
costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from accounting import curve
from accounting import filter as privacy_filter
from accounting.events import MechanismEvent

# The events charged at a target epsilon; None when no plan exists at that target (too small to
# calibrate, or at or below what the history has already spent): such a target does not fit.
EventsAt = Callable[[float], Sequence[MechanismEvent] | None]


def admits(
    history: Sequence[MechanismEvent],
    events: Sequence[MechanismEvent],
    epsilon_cap: float,
    delta_cap: float,
) -> bool:
    """The ledger's own stop rule for a cap (epsilon_cap, delta_cap), on the running RDP curve of
    the history followed by `events`."""
    rdp = curve.curve_of([*history, *events]).rdp
    return privacy_filter.admits(rdp, epsilon_cap, delta_cap)


def spent(history: Sequence[MechanismEvent], delta_cap: float) -> float:
    """The RDP epsilon the history has spent (0 for an empty one; infinite after a non-DP
    release): the search's lower end."""
    return curve.curve_of(history).epsilon(delta_cap) if history else 0.0


def largest_target(
    history: Sequence[MechanismEvent],
    events_at: EventsAt,
    target: float,
    epsilon_cap: float,
    delta_cap: float,
    *,
    rounds: int = 8,
    decimals: int | None = 2,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> float | None:
    """The largest target epsilon in (spent, `target`) whose events the cap admits after the
    history, to (target - spent) / 2**rounds, by `rounds` bisection steps; None if none of the
    targets tried fits. With `decimals`, rounded down to that many decimals unless that would fall
    to what the history has spent. `progress(done, rounds)` after each step (one call per plan)."""
    lower = spent(history, delta_cap)
    fits, refused, found = lower, float(target), False
    progress(0, rounds)
    for i in range(rounds):
        guess = (fits + refused) / 2
        events = events_at(guess)
        admitted = events is not None and admits(history, events, epsilon_cap, delta_cap)
        fits, refused = (guess, refused) if admitted else (fits, guess)
        found = found or admitted
        progress(i + 1, rounds)
    if not found:
        return None
    if decimals is None:
        return fits
    scale = 10.0**decimals
    rounded = math.floor(fits * scale) / scale
    return rounded if rounded > lower else fits
