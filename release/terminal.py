"""Terminal output shared by the CLI and `make demo`: the console, epsilon figures, progress bars
driven by the mechanisms' progress(stage, done, total) callback, and a stored plan's summary."""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from release.records import Release
from synth.progress import ProgressFn
from synth.registry import guarantee_label

console = Console()
err_console = Console(stderr=True)


OUR_PACKAGES = ("accounting", "synth", "audit", "release", "dashboard")


def say_our_warnings(out: Console | None = None) -> None:
    """Warnings raised by privrelease's own code (a shipped checkpoint refused, a device's noise
    source missing) printed as one line of ours ("warning: ..."), not in Python's format with its
    file, line and source; other warnings keep Python's own handling."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category.__module__.split(".")[0] in OUR_PACKAGES:
            (out or err_console).print(f"[yellow]warning:[/] {escape(str(message))}")
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def fmt_eps(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "∞ (no DP guarantee)"
    return f"{x:.4f}"


def print_plan(rel: Release) -> None:
    p = rel.plan
    console.print(f"[bold]Release {rel.release_id}[/] ({rel.state}) — {p.mechanism} on {p.dataset}")
    console.print(f"  plan digest: {rel.plan_digest}")
    console.print(f"  events: {'; '.join(p.events_described)}")
    line = (p.mechanism_plan or {}).get("guarantee_description")
    console.print(
        f"  guarantee: {escape(guarantee_label(p.guarantee_kind))}"
        + (f" — {escape(str(line))}" if line else "")
    )
    b, a = p.epsilon_before, p.epsilon_after
    console.print(
        f"  epsilon before: RDP {fmt_eps(b['epsilon_rdp'])}  PLD {fmt_eps(b['epsilon_pld'])}"
    )
    console.print(
        f"  epsilon after:  RDP {fmt_eps(a['epsilon_rdp'])}  PLD {fmt_eps(a['epsilon_pld'])}   "
        f"(cap {p.epsilon_cap:g}, delta {a['delta']:g})"
    )
    if p.remaining_after_rdp is not None:
        console.print(f"  remaining after (RDP): {p.remaining_after_rdp:.4f}")
    console.print(f"  images: {p.expected_count}")
    print_choices((p.mechanism_plan or {}).get("choices"))
    for w in p.warnings:
        console.print(f"  [yellow]warning:[/] {escape(w)}")
    if p.requires_acknowledgement:
        console.print("  [yellow]approval requires --acknowledge-non-dp[/]")


def print_choices(choices: object) -> None:
    """The mechanism's choices in its own words (its plan's "choices" lines), if it gives any."""
    for line in choices if isinstance(choices, list) else ():
        console.print(f"  choice: {escape(str(line))}")


@contextmanager
def rich_progress(out: Console | None = None) -> Iterator[ProgressFn]:
    """Live bars on a terminal; in a log (CI, `make demo > file`) a plain line per stage every 10%.
    `out` is the console to draw on (stdout's by default; stderr's where stdout carries JSON)."""
    out = out or console
    if not out.is_terminal:
        yield _log_lines(out)
        return
    columns = (
        TextColumn("[bold blue]{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=out, transient=False) as bar:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


class _Lines(logging.Handler):
    def __init__(self, out: Console) -> None:
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.print(f"  {record.getMessage()}", markup=False, highlight=False, soft_wrap=True)


@contextmanager
def run_notices(out: Console | None = None) -> Iterator[None]:
    """While a run goes on: its events (an item retried, a worker killed: release/run_log.py's
    `NOTICES`) printed as one line each on `out`."""
    lines = _Lines(out or console)
    notices = logging.getLogger("privrelease.run")
    notices.addHandler(lines)
    level = notices.level
    if notices.getEffectiveLevel() > logging.INFO:
        notices.setLevel(logging.INFO)
    try:
        yield
    finally:
        notices.removeHandler(lines)
        notices.setLevel(level)


def _log_lines(out: Console) -> ProgressFn:
    started = time.monotonic()
    last: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        tenth = (10 * done) // max(total, 1)
        if last.get(stage) == tenth:
            return
        last[stage] = tenth
        out.print(
            f"  {stage}: {done}/{total} ({100 * done // max(total, 1)}%, "
            f"{time.monotonic() - started:.0f} s)",
            markup=False,
            highlight=False,
        )

    return update
