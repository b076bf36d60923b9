"""Ledger: the charges with filters, cumulative epsilon over time per dataset, and a what-if
panel."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.charts import budget_gauge, cumulative_epsilon_chart
from dashboard.common import fmt_eps, guarded, short_time
from release import keys, views
from release.views import Store


def ledger_rows(store: Store) -> tuple[list[dict], dict[str, float]]:
    """The budget breakdown of every dataset, tagged with the dataset; and each dataset's cap."""
    rows, caps = [], {}
    for ds in views.datasets(store):
        caps[ds.name] = ds.epsilon_cap
        for r in data.breakdown(store, ds.name):
            rows.append({"dataset": ds.name, "time": r.settled_at or r.reserved_at, **r.to_dict()})
    return rows, caps


def render(store: Store, ident: keys.Identity) -> None:
    st.title(":material/receipt_long: Ledger")
    rows, caps = ledger_rows(store)
    st.subheader("Charges")
    events_table(rows)
    st.subheader("Cumulative ε over time")
    st.caption(
        "ε of each dataset's whole composed history after each charge (never a sum of epsilons). "
        "Solid: RDP (the reference); dashed: PLD (tighter); dotted rule: the dataset's cap."
    )
    if rows:
        st.altair_chart(cumulative_epsilon_chart(rows, caps), width="stretch")
    else:
        st.info("No charges yet.")
    st.subheader("What-if: plan a DP-SGD run")
    with st.container(border=True):
        what_if(store, list(caps))


def events_table(rows: list[dict]) -> None:
    if not rows:
        st.info("No charges yet.")
        return
    df = pd.DataFrame(rows)
    f1, f2, f3, f4 = st.columns([1, 1, 1, 1.4])
    datasets = f1.multiselect("Dataset", sorted(df["dataset"].unique()), key="ledger_datasets")
    states = f2.multiselect("State", ["reserved", "committed", "refunded"], key="ledger_states")
    actors = f3.multiselect("Actor", sorted(df["actor"].unique()), key="ledger_actors")
    text = f4.text_input("Search (run id, description, events)", key="ledger_search")
    mask = pd.Series(True, index=df.index)
    if datasets:
        mask &= df["dataset"].isin(datasets)
    if states:
        mask &= df["state"].isin(states)
    if actors:
        mask &= df["actor"].isin(actors)
    if text:
        hay = (df["run_id"] + " " + df["description"] + " " + df["events"]).str.lower()
        mask &= hay.str.contains(text.lower(), regex=False)
    shown = df[mask]
    table = pd.DataFrame(
        {
            "#": shown["position"],
            "dataset": shown["dataset"],
            "run": shown["run_id"],
            "state": shown["state"],
            "ε RDP": shown["epsilon_rdp"].map(fmt_eps),
            "cum. ε RDP": shown["cumulative_epsilon_rdp"].map(fmt_eps),
            "cum. ε PLD": shown["cumulative_epsilon_pld"].map(fmt_eps),
            "events": shown["events"],
            "description": shown["description"],
            "actor": shown["actor"],
            "settled (UTC)": shown["settled_at"].map(short_time),
            "reserved (UTC)": shown["reserved_at"].map(short_time),
        }
    )
    st.caption(
        f"{len(shown)} of {len(df)} charges. A refunded charge counts nothing; a committed one "
        "counts the steps it actually executed."
    )
    colour = {"committed": "#2e9d5b", "reserved": "#e0a100", "refunded": "#7b8794"}
    st.dataframe(
        table.style.map(
            lambda v: f"color: {colour.get(v, '#1f2933')}; font-weight: 600", subset=["state"]
        ),
        hide_index=True,
        width="stretch",
    )


def _whatif_form(names: list[str]) -> tuple[str, float, float, int]:
    """The what-if form: dataset, noise multiplier, sampling rate and steps of the planned run."""
    with st.form("whatif"):
        c1, c2, c3, c4 = st.columns(4)
        name = c1.selectbox("Dataset", names, key="whatif_dataset")
        sigma = c2.number_input(
            "Noise multiplier σ",
            min_value=0.0,
            value=1.0,
            step=0.1,
            format="%.3f",
            key="whatif_sigma",
        )
        q = c3.number_input(
            "Sampling rate q",
            min_value=0.0,
            max_value=1.0,
            value=0.01,
            step=0.005,
            format="%.4f",
            key="whatif_q",
        )
        steps = c4.number_input("Steps", min_value=0, value=500, step=50, key="whatif_steps")
        st.form_submit_button("Compute ε", icon=":material/calculate:")
    return name, sigma, q, steps


def what_if(store: Store, names: list[str]) -> None:
    """Epsilon of a planned DP-SGD run composed with the dataset's history. Changes nothing."""
    if not names:
        st.info("Register a dataset to plan against its budget.")
        return
    st.caption(
        "ε of a planned DP-SGD run composed with the dataset's whole history (RDP and PLD from "
        "dp-accounting), against the remaining budget. Nothing is charged."
    )
    name, sigma, q, steps = _whatif_form(names)
    with guarded("computing the what-if"):
        now = data.summary(store, name)
        w = data.what_if(store, name, q, sigma, steps)
        cap = now.epsilon_cap
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("ε now (RDP)", fmt_eps(now.spent_epsilon_rdp))
        m2.metric(
            "ε after (RDP)",
            fmt_eps(w.epsilon_rdp),
            delta=None
            if not w.finite or not math.isfinite(now.spent_epsilon_rdp)
            else f"+{w.epsilon_rdp - now.spent_epsilon_rdp:.3f}",
            delta_color="inverse",
        )
        m3.metric("ε after (PLD)", fmt_eps(w.epsilon_pld))
        m4.metric("Remaining after (cap − RDP)", fmt_eps(cap - w.epsilon_rdp) if w.finite else "—")
        g, verdict = st.columns([1, 2])
        g.pyplot(
            budget_gauge(
                cap,
                now.spent_epsilon_rdp,
                now.spent_epsilon_pld,
                title=f"{name}: now → planned",
                planned_rdp=w.epsilon_rdp,
            ),
            width="stretch",
        )
        with verdict:
            st.markdown(f"**Planned run:** {w.described}, δ = {w.delta:g}")
            if now.dp_void:
                st.warning(
                    "This dataset already had a release without a DP guarantee (k-anonymity, "
                    "de-identification): its DP guarantees no longer hold, whatever noise is used.",
                    icon=":material/warning:",
                )
            else:
                _cap_verdict(bool(w.fits_cap), float(w.filter_epsilon or 0.0), cap, w.epsilon_rdp)
            st.caption("Blue dashed tick on the gauge: ε after the planned run.")


def _cap_verdict(admitted: bool, filter_eps: float, cap: float, eps_rdp: float) -> None:
    """The ledger's verdict (its privacy filter, README "Privacy guarantees"), not RDP epsilon <=
    cap: the filter is what keeps the cap valid when releases are chosen after seeing earlier
    ones."""
    if admitted:
        st.success(
            f"Fits the cap {cap:g}: the cap's privacy filter would be at {filter_eps:.3f} (RDP ε "
            f"after: {eps_rdp:.3f}).",
            icon=":material/check_circle:",
        )
    else:
        st.error(
            f"Exceeds the cap {cap:g}: the cap's privacy filter would be at {filter_eps:.3f}, so "
            "the ledger would refuse this run. Use more noise, a smaller q or fewer steps.",
            icon=":material/block:",
        )
