"""Cached reads for the dashboard. PLD accounting takes about a second per history, so budgets,
per-charge breakdowns and what-ifs are cached, keyed by the workspace and a cheap signature of the
ledger's rows: any reserve/commit/refund changes the signature, so a cached value is never stale.
The figures are release.budget's; this module only caches them."""

from __future__ import annotations

import streamlit as st

from release import budget as budgets
from release.views import Store, open_store


@st.cache_resource(max_entries=64, show_spinner=False)
def _budget(root: str, name: str, signature: str):  # the ledger's Budget, shared by the three below
    return budgets.budget(open_store(root), name)


@st.cache_resource(max_entries=64, show_spinner=False)
def _summary(root: str, name: str, signature: str) -> budgets.BudgetSummary:
    return budgets.summary(_budget(root, name, signature))


@st.cache_resource(max_entries=64, show_spinner=False)
def _breakdown(root: str, name: str, signature: str) -> list[budgets.ChargeRow]:
    return budgets.breakdown(_budget(root, name, signature))


@st.cache_data(max_entries=256, show_spinner="Composing the history (RDP and PLD)…")
def _what_if(
    root: str, name: str, signature: str, sample_rate: float, sigma: float, steps: int
) -> budgets.WhatIf:
    return budgets.what_if(sample_rate, steps, sigma=sigma, history=_budget(root, name, signature))


def summary(store: Store, name: str) -> budgets.BudgetSummary:
    return _summary(str(store.workspace.root), name, budgets.ledger_signature(store))


def breakdown(store: Store, name: str) -> list[budgets.ChargeRow]:
    return _breakdown(str(store.workspace.root), name, budgets.ledger_signature(store))


def what_if(
    store: Store, name: str, sample_rate: float, sigma: float, steps: int
) -> budgets.WhatIf:
    """A planned DP-SGD run composed with the dataset's history, with the ledger's own cap check."""
    return _what_if(
        str(store.workspace.root),
        name,
        budgets.ledger_signature(store),
        float(sample_rate),
        float(sigma),
        int(steps),
    )
