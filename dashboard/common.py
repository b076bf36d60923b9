"""Shared dashboard plumbing: the store, which role sees which page, error display, formatting."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from release.views import PrivReleaseError, Store, open_store

ALL_ROLES = ("steward", "auditor", "consumer")
INTERNAL_ROLES = ("steward", "auditor")  # may see internal audit results (ARCHITECTURE.md rule 4)
# Page -> roles allowed to open it. Consumers see published releases and bundles only.
PAGE_ROLES: dict[str, tuple[str, ...]] = {
    "Overview": ALL_ROLES,
    "Ledger": INTERNAL_ROLES,
    "Releases": ALL_ROLES,
    "Audit trail": INTERNAL_ROLES,
    "Downloads": ALL_ROLES,
}
PAGE_ICONS = {
    "Overview": ":material/dashboard:",
    "Ledger": ":material/receipt_long:",
    "Releases": ":material/rocket_launch:",
    "Audit trail": ":material/link:",
    "Downloads": ":material/download:",
}
ROLE_BADGE = {
    "steward": ":material/verified_user: steward",
    "auditor": ":material/policy: auditor",
    "consumer": ":material/person: consumer",
}


def pages_for(role: str) -> list[str]:
    return [p for p, roles in PAGE_ROLES.items() if role in roles]


def get_store() -> Store:
    """The workspace named by PRIVRELEASE_HOME (set by `privrelease dashboard`)."""
    root = os.environ.get("PRIVRELEASE_HOME")
    if not root:
        raise PrivReleaseError(
            "PRIVRELEASE_HOME is not set. Start the dashboard with `privrelease dashboard` (or set "
            "PRIVRELEASE_HOME to a workspace directory)."
        )
    return open_store(root)


@contextmanager
def guarded(what: str = "") -> Iterator[None]:
    """Show errors as messages, never as tracebacks."""
    try:
        yield
    except PrivReleaseError as exc:
        st.error(f"{what + ': ' if what else ''}{exc}", icon=":material/block:")
    except Exception as exc:  # noqa: BLE001 - an unexpected bug still must not show a traceback
        logging.getLogger("privrelease.dashboard").exception(
            "unexpected error while %s", what or "rendering"
        )
        st.error(
            f"Unexpected error{' while ' + what if what else ''}: {type(exc).__name__}: {exc}",
            icon=":material/warning:",
        )


def flash(kind: str, message: str) -> None:
    """Keep a message across the rerun that follows an action."""
    st.session_state["flash"] = (kind, message)


def show_flash() -> None:
    item = st.session_state.pop("flash", None)
    if item:
        getattr(st, item[0])(item[1])


def fmt_eps(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "∞ (no DP)"
    return f"{x:.{digits}f}"


def short_time(ts: object) -> str:
    return ts[:19].replace("T", " ") if isinstance(ts, str) and ts else "—"
