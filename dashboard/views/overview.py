"""Overview: each dataset's budget as a gauge, and the recent releases."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from pandas.io.formats.style import Styler

from dashboard import data
from dashboard.charts import budget_gauge
from dashboard.common import INTERNAL_ROLES, fmt_eps, short_time
from release import keys, manager, views
from release.records import Release
from release.views import Store, guarantee_label

STATE_COLOURS = {
    "planned": "#3566c2",
    "approved": "#2e9d5b",
    "rejected": "#8a1c1c",
    "running": "#e0a100",
    "checked": "#2e7d8f",
    "published": "#2e9d5b",
    "failed": "#d64545",
}
STATE_ICONS = {s: s for s in STATE_COLOURS}  # plain text: emoji fonts are not everywhere


def guarantee_text(rel: Release) -> str:
    g = rel.guarantee
    if g:
        return g.get("description") or str(g)
    if rel.plan.requires_acknowledgement:
        return guarantee_label(rel.plan.guarantee_kind)
    return f"planned ε ≤ {fmt_eps(rel.plan.epsilon_after.get('epsilon_rdp'))}"


def releases_frame(rels: list[Release]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "release": r.release_id,
                "dataset": r.plan.dataset,
                "mechanism": r.mechanism,
                "state": STATE_ICONS.get(r.state, r.state),
                "guarantee": guarantee_text(r),
                "updated (UTC)": short_time(r.updated_at),
            }
            for r in rels
        ]
    )


def styled_releases(rels: list[Release]) -> Styler:
    """The releases table with each state in its colour."""
    return releases_frame(rels).style.map(
        lambda v: f"color: {STATE_COLOURS.get(v, '#1f2933')}; font-weight: 600", subset=["state"]
    )


def render(store: Store, ident: keys.Identity) -> None:
    st.title(":material/dashboard: Overview")
    datasets = views.datasets(store)
    rels = manager.list_releases(store, ident)
    c1, c2, c3 = st.columns(3)
    c1.metric("Datasets", len(datasets))
    c2.metric("Releases" if ident.role in INTERNAL_ROLES else "Published releases", len(rels))
    if ident.role in INTERNAL_ROLES:
        c3.metric("Plans awaiting approval", sum(r.state == "planned" for r in rels))
    else:
        c3.metric("Downloadable bundles", sum(r.state == "published" for r in rels))

    st.subheader("Privacy budgets")
    st.caption(
        "Filled arc: ε spent by RDP (the reference, checked against the cap). Black tick: PLD "
        "(tighter). Remaining = cap − RDP spend."
    )
    if not datasets:
        st.info("No dataset registered yet. Register one with `privrelease dataset register`.")
    per_row = 3
    for start in range(0, len(datasets), per_row):
        cols = st.columns(per_row)
        for col, ds in zip(cols, datasets[start : start + per_row], strict=False):
            b = data.summary(store, ds.name)
            with col, st.container(border=True):
                st.pyplot(
                    budget_gauge(
                        ds.epsilon_cap, b.spent_epsilon_rdp, b.spent_epsilon_pld, title=ds.name
                    ),
                    width="stretch",
                )
                st.caption(
                    f"`{ds.dataset_id}` · {ds.record_count:,} records · δ = {ds.delta_cap:g} · "
                    f"{b.charges_counted} charge(s)"
                )
                if b.dp_void:
                    st.warning(
                        "A release without a DP guarantee (k-anonymity, de-identification) was "
                        "made from this dataset: its DP guarantees no longer hold.",
                        icon=":material/warning:",
                    )

    st.subheader("Recent releases")
    if not rels:
        st.info(
            "No releases yet." if ident.role in INTERNAL_ROLES else "No published releases yet."
        )
    else:
        st.dataframe(styled_releases(rels[:10]), hide_index=True, width="stretch")
