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
    """The identity acting on the command line (`--as NAME`, else $PRIVRELEASE_ACTOR, else the OS
    user name), proven by its private key and checked for one of `roles`. A name alone never
    authorises a change."""
    from release import keys

    return keys.authenticate(store(), actor_name(name, *roles), *roles)


def actor_name(name: str | None, *roles: str) -> str:
    """`name` if given; else the default identity ($PRIVRELEASE_ACTOR, else the OS user name), which
    must exist: if it does not, the error names the identities that do and how to choose one."""
    from release import keys

    if name:
        return name
    s, who = store(), default_actor()
    try:
        keys.get_identity(s, who)
    except keys.UnknownIdentityError:
        raise keys.UnknownIdentityError(_no_default_identity(s, who, roles)) from None
    return who


def _no_default_identity(s: Store, who: str, roles: tuple[str, ...]) -> str:
    """Why the implicit identity failed, which identities exist, and how to choose one."""
    from release import keys

    source = (
        "from $PRIVRELEASE_ACTOR"
        if os.environ.get("PRIVRELEASE_ACTOR")
        else "your user name: no --as was given and $PRIVRELEASE_ACTOR is not set"
    )
    everyone = keys.list_identities(s)
    if not everyone:
        return (
            f"No identity named {who!r} ({source}), and this workspace has no identities yet: "
            "create the first steward with `privrelease init --steward NAME`."
        )
    known = [i for i in everyone if not roles or i.role in roles]
    which = f"Identities with the {' or '.join(roles)} role here" if roles else "Identities here"
    names = ", ".join(f"{i.name} ({i.role})" for i in known) or "none"
    return (
        f"No identity named {who!r} ({source}). {which}: {names}. Act as one with `--as NAME`, or "
        "set it once with `export PRIVRELEASE_ACTOR=NAME`."
    )


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
