"""Per-item functions for executor tests that run on a site's cluster (helpers, not tests): its
scheduler and workers import them by module name, so they live in an importable module."""

from __future__ import annotations

import time


def nap(seconds: float, item: int) -> int:
    """Sleep, then return the item: an item that takes a while."""
    time.sleep(seconds)
    return item
