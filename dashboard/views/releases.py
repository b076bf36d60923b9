"""Releases: plans awaiting approval (approve/reject: steward only), and each release's detail —
parameters, run/publish actions, audit report, sample images and the k-anonymity cluster viewer."""

from __future__ import annotations

import streamlit as st

from dashboard.common import INTERNAL_ROLES, flash, fmt_eps, guarded, short_time
from dashboard.views import release_detail
from dashboard.views.overview import styled_releases
from release import keys, manager
from release.records import Release
from release.views import Store, guarantee_label


def render(store: Store, ident: keys.Identity) -> None:
    st.title(":material/rocket_launch: Releases")
    rels = manager.list_releases(store, ident)  # a consumer gets published releases only
    if ident.role in INTERNAL_ROLES:
        pending = [r for r in rels if r.state == "planned"]
        st.subheader(f"Plans awaiting approval ({len(pending)})")
        if not pending:
            st.info(
                "No plan is waiting for approval. Plan one "
                "with `privrelease release plan SPEC.toml`."
            )
        for rel in pending:
            plan_card(store, ident, rel)
    st.subheader("All releases" if ident.role in INTERNAL_ROLES else "Published releases")
    ids = [r.release_id for r in rels]
    requested = st.session_state.get("release")
    if requested is not None and requested not in ids:
        # e.g. a consumer asking for an unpublished release: refuse rather than fall back silently
        sees = "published releases only" if ident.role == "consumer" else "existing releases only"
        st.error(
            f"Release {requested!r} is not available to you (a {ident.role} sees {sees}).",
            icon=":material/block:",
        )
        del st.session_state["release"]
    if not rels:
        st.info(
            "No releases yet." if ident.role in INTERNAL_ROLES else "No published releases yet."
        )
        return
    st.dataframe(styled_releases(rels), hide_index=True, width="stretch")
    by_id = {r.release_id: r for r in rels}
    chosen = st.selectbox(
        "Release",
        ids,
        key="release",
        format_func=lambda i: (
            f"{i} · {by_id[i].mechanism} on {by_id[i].plan.dataset} · {by_id[i].state}"
        ),
    )
    release_detail.render(store, ident, manager.get_release(store, chosen))


def _approve_button(store: Store, ident: keys.Identity, rel: Release) -> None:
    """The steward's approval of the plan shown (with the no-DP acknowledgement where needed)."""
    plan, rid = rel.plan, rel.release_id
    ack = False
    if plan.requires_acknowledgement:
        ack = st.checkbox(
            "I accept: no DP guarantee",
            key=f"ack_{rid}",
            help=f"This release ({guarantee_label(plan.guarantee_kind)}) carries no "
            "differential-privacy guarantee and "
            "voids the DP meaning of every release of "
            "this dataset: its epsilon becomes infinite.",
        )
    if st.button(
        "Approve (sign the plan)",
        key=f"approve_{rid}",
        type="primary",
        icon=":material/check:",
    ):
        with guarded("approving"):
            # The digest shown above is what the steward reviewed; the manager refuses any
            # other plan.
            manager.approve(store, rid, ident.name, digest=rel.plan_digest, acknowledge_non_dp=ack)
            flash(
                "success",
                f"Approved {rid}. A steward can now run it (Releases → select it → Run).",
            )
            st.rerun()


def plan_card(store: Store, ident: keys.Identity, rel: Release) -> None:
    plan, rid = rel.plan, rel.release_id
    before, after = plan.epsilon_before, plan.epsilon_after
    with st.container(border=True):
        st.markdown(f"#### {rid} · {plan.mechanism} on **{plan.dataset}**")
        st.caption(
            f"Planned by {rel.created_by} at {short_time(rel.created_at)} UTC · plan digest "
            f"`{rel.plan_digest[:16]}…`"
        )
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("ε before (RDP)", fmt_eps(before["epsilon_rdp"]))
        m2.metric("ε after (RDP)", fmt_eps(after["epsilon_rdp"]))
        m3.metric("ε after (PLD)", fmt_eps(after["epsilon_pld"]))
        m4.metric("Images released", plan.expected_count)
        st.markdown("**Events charged:** " + "; ".join(plan.events_described))
        choices = (plan.mechanism_plan or {}).get("choices")
        if isinstance(choices, list) and choices:
            st.markdown("**Choices:**\n" + "".join(f"\n- {c}" for c in choices))
        st.caption(
            f"Cap ε {plan.epsilon_cap:g} at δ = {after['delta']:g}; remaining after (RDP): "
            f"{fmt_eps(plan.remaining_after_rdp)}"
        )
        for w in plan.warnings:
            st.warning(w, icon=":material/warning:")
        with st.expander("Full plan (JSON)"):
            st.json(plan.to_json(), expanded=False)
        if ident.role != "steward":
            st.caption("Only a steward can approve or reject a plan.")
            return
        approve_col, reject_col = st.columns(2)
        with approve_col:
            _approve_button(store, ident, rel)
        with reject_col:
            reason = st.text_input(
                "Reason for rejection", key=f"reason_{rid}", placeholder="required to reject"
            )
            if st.button("Reject", key=f"reject_{rid}", icon=":material/close:"):
                with guarded("rejecting"):
                    manager.reject(store, rid, ident.name, reason)
                    flash("info", f"Rejected {rid}: {reason}")
                    st.rerun()
