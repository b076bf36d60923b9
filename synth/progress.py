"""Progress reporting shared by mechanisms: a plain callback, so the CLI can drive rich progress
bars and the dashboard st.progress without the mechanisms knowing either."""

from __future__ import annotations

from collections.abc import Callable

# progress(stage, done, total): called as work advances; `stage` is a short human label.
ProgressFn = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    """Default: report nothing."""
