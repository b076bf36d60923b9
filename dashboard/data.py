"""Cached reads for the dashboard. PLD accounting takes about a second per history, so budgets and
per-charge breakdowns are cached, keyed by the workspace and a cheap signature of the ledger's rows:
any reserve/commit/refund changes the signature, so a cached value is never stale."""
from __future__ import annotations

import streamlit as st

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.epsilon import EpsilonReport, epsilon_report
from accounting.events import MechanismEvent, events_from_text, events_to_text
from accounting.store import Store, Workspace
from release.manager import charge_breakdown, ledger_signature


@st.cache_resource(max_entries=64, show_spinner=False)
def _budget(root: str, name: str, signature: str) -> ledger.Budget:
    return ledger.budget(Store(Workspace(root)), name)


@st.cache_resource(max_entries=64, show_spinner=False)
def _breakdown(root: str, name: str, signature: str) -> list[dict]:
    return charge_breakdown(_budget(root, name, signature))


def budget(store: Store, name: str) -> ledger.Budget:
    return _budget(str(store.workspace.root), name, ledger_signature(store))


def breakdown(store: Store, name: str) -> list[dict]:
    return _breakdown(str(store.workspace.root), name, ledger_signature(store))


@st.cache_data(max_entries=256, show_spinner="Composing the history (RDP and PLD)…")
def _report(events_text: str, delta: float) -> tuple[float, float, float]:
    r = epsilon_report(events_from_text(events_text), delta)
    return r.epsilon_rdp, r.epsilon_pld, r.delta


def report(events: list[MechanismEvent], delta: float) -> EpsilonReport:
    return EpsilonReport(*_report(events_to_text(events), float(delta)))


def cap_check(events: list[MechanismEvent], epsilon_cap: float, delta_cap: float) -> tuple[bool, float]:
    """The ledger's own stop rule for this history: (would the cap's privacy filter admit it, the filter's
    epsilon). The same check `ledger.reserve` makes, so the what-if never disagrees with the ledger."""
    return privacy_filter.cap_check(curve.curve_of(events).rdp, epsilon_cap, delta_cap)
