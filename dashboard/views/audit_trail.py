"""Audit trail: the hash chain, its verification status, and the entries where it breaks
highlighted."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard.common import short_time
from release import keys, views
from release.views import Store

BROKEN_STYLE = "background-color: #fde2e2; color: #8a1c1c; font-weight: 600"
ROW_LIMIT = 1000


def trail_frame(rows: list[dict], broken: set[int]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "seq": r["seq"],
                "status": "BROKEN" if r["seq"] in broken else "ok",
                "time (UTC)": short_time(r["ts"]),
                "actor": r["actor"],
                "action": r["action"],
                "entry hash": r["entry_hash"][:12] + "…",
                "payload": json.dumps(r["payload"], sort_keys=True),
            }
            for r in rows
        ]
    )


def render(store: Store, ident: keys.Identity) -> None:
    st.title(":material/link: Audit trail")
    result = views.verify_trail(store)
    if result.ok:
        st.success(
            f"Chain verified: {result.length} entries, each hashing the previous one. Head "
            f"`{result.head_hash[:16]}…` matches the workspace's recorded head.",
            icon=":material/check_circle:",
        )
    else:
        st.error(
            f"Chain BROKEN: {len(result.problems)} problem(s) over {result.length} entries. "
            "Publishing is refused until this is resolved.",
            icon=":material/gpp_bad:",
        )
        for p in result.problems:
            st.markdown(f"- {p}")
    rows = views.trail_entries(store)  # newest first
    if not rows:
        st.info("The trail is empty.")
        return
    f1, f2, f3 = st.columns([1, 1, 1])
    actions = f1.multiselect("Action", sorted({r["action"] for r in rows}), key="trail_actions")
    actors = f2.multiselect("Actor", sorted({r["actor"] for r in rows}), key="trail_actors")
    only_broken = f3.toggle("Only broken entries", key="trail_broken", disabled=result.ok)
    broken = set(result.broken_seqs)
    shown = [
        r
        for r in rows
        if (not actions or r["action"] in actions)
        and (not actors or r["actor"] in actors)
        and (not only_broken or r["seq"] in broken)
    ]
    df = trail_frame(shown[:ROW_LIMIT], broken)
    st.caption(
        f"{len(shown)} of {len(rows)} entries, newest first"
        + (f" (first {ROW_LIMIT} shown)" if len(shown) > ROW_LIMIT else "")
        + ". "
        "Verify from the command line with `privrelease audit verify`."
    )
    if df.empty:
        st.info("No entries match the filters.")
        return
    styled = df.style.apply(
        lambda row: [BROKEN_STYLE if row["seq"] in broken else ""] * len(row), axis=1
    )
    st.dataframe(styled, hide_index=True, width="stretch", height=min(36 * (len(df) + 1) + 4, 640))
