"""Shared CLI plumbing: the workspace option, the store, output in tables or JSON, error display."""
from __future__ import annotations

import getpass
import json
import math
import os
from pathlib import Path
from typing import Any

from rich.table import Table

from accounting.store import Store, Workspace
from release.terminal import console as console
from release.terminal import err_console as err_console
from release.terminal import fmt_eps as fmt_eps


class State:
    workspace: Path | None = None


STATE = State()


def workspace() -> Workspace:
    return Workspace(STATE.workspace)


def store() -> Store:
    return Store(workspace())


def default_actor() -> str:
    return os.environ.get("PRIVRELEASE_ACTOR") or getpass.getuser()


def acting(name: str | None, *roles: str):
    """The identity acting on the command line (`--as NAME`, default $PRIVRELEASE_ACTOR), proven by its
    private key and checked for one of `roles`. A name alone never authorises a change (README, Trust model)."""
    from release import keys

    return keys.authenticate(store(), name or default_actor(), *roles)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no infinity; null means "no DP guarantee"
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    print(json.dumps(_clean(obj), indent=2, sort_keys=True, default=str))


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold cyan")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(v) for v in r])
    return t
