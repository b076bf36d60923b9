"""Rich progress bars driven by the mechanisms' progress(stage, done, total) callback."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rich.console import Console

from release.cli.common import console as stdout_console
from synth.progress import ProgressFn


@contextmanager
def rich_progress(console: Console = stdout_console) -> Iterator[ProgressFn]:
    """Live bars on a terminal; in a log (CI, `make demo > file`) a plain line per stage every 10%."""
    if not console.is_terminal:
        yield _log_lines(console)
        return
    columns = (TextColumn("[bold blue]{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        tasks: dict[str, int] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


def _log_lines(console: Console) -> ProgressFn:
    started = time.monotonic()
    last: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        tenth = (10 * done) // max(total, 1)
        if last.get(stage) == tenth:
            return
        last[stage] = tenth
        console.print(f"  {stage}: {done}/{total} ({100 * done // max(total, 1)}%, "
                      f"{time.monotonic() - started:.0f} s)", markup=False, highlight=False)

    return update
