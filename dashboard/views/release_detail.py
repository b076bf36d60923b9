"""One release: parameters, steward actions (run with progress, publish), audit report, sample
images and, for k-anonymous releases, the cluster viewer. Internal results (computed on sensitive
data) are shown to stewards and auditors only; a consumer sees the pass/fail verdicts
(ARCHITECTURE.md rule 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from dashboard.charts import display_scale, image_grid, to_display
from dashboard.common import INTERNAL_ROLES, flash, fmt_eps, guarded, short_time
from release import keys, manager, views
from release.card import verdict_note
from release.records import Release
from release.views import AuditReport, Store, guarantee_label

VERDICT_ICON = {"pass": "pass", "fail": "FAIL", "info": "info"}
SAMPLE_COUNT = 40


def render(store: Store, ident: keys.Identity, rel: Release) -> None:
    rid, internal = rel.release_id, ident.role in INTERNAL_ROLES
    st.markdown(f"### {rid}")
    res, g, plan = rel.result, rel.guarantee, rel.plan
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("State", rel.state)
    c2.metric("Mechanism", rel.mechanism)
    c3.metric("Dataset", plan.dataset)
    c4.metric("Images", res.count if res and res.count is not None else plan.expected_count)
    guarantee = g.get("description") or (
        guarantee_label(plan.guarantee_kind)
        if plan.requires_acknowledgement
        else f"planned ε ≤ {fmt_eps(plan.epsilon_after['epsilon_rdp'])} (RDP)"
    )
    st.markdown(f"**Guarantee:** {guarantee}")
    if rel.reason:
        (st.error if rel.state == "failed" else st.info)(f"Reason: {rel.reason}")
    attempts(store, rid)
    if ident.role == "steward":
        actions(store, ident, rel)

    tabs = st.tabs(
        ["Parameters", "Audit report", "Samples"]
        + (["Clusters"] if internal and _has_clusters(store, rel) else [])
    )
    with tabs[0]:
        parameters(store, rel, internal)
    with tabs[1]:
        audit_section(store, rid, internal)
    with tabs[2]:
        samples(store, rid)
    if len(tabs) > 3:
        with tabs[3]:
            with guarded("showing the clusters"):
                cluster_viewer(store, ident, rel)


def attempts(store: Store, rid: str) -> None:
    """The run's attempts (when, how each ended, its items), when it was tried more than once or
    failed: a release that failed and then succeeded shows its history, not a stale reason."""
    tried = views.attempts(store, rid)
    if len(tried) < 2 and not any(a.outcome in ("failed", "died") for a in tried):
        return
    with st.expander(f"Run attempts ({len(tried)})", expanded=False):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "attempt": a.number,
                        "started (UTC)": short_time(a.started_at),
                        "ended (UTC)": short_time(a.ended_at) if a.ended_at else "",
                        "outcome": a.outcome,
                        "items done": (
                            f"{a.items_done} of {a.items_total}" if a.items_total else ""
                        ),
                        "retried": str(a.retries) if a.retries is not None else "",
                        "why it stopped": a.reason or "",
                    }
                    for a in tried
                ]
            ),
            hide_index=True,
            width="stretch",
        )


def actions(store: Store, ident: keys.Identity, rel: Release) -> None:
    rid, state = rel.release_id, rel.state
    if state in ("approved", "failed"):
        label = "Run release" if state == "approved" else "Run again (resumes, no double charge)"
        if st.button(label, key=f"run_{rid}", type="primary", icon=":material/play_arrow:"):
            bar = st.progress(0.0, text="Starting…")

            def progress(stage: str, done: int, total: int) -> None:
                bar.progress(
                    min(done / total, 1.0) if total else 0.0, text=f"{stage}: {done}/{total}"
                )

            with guarded("running the release"):
                out = manager.run_release(store, rid, ident.name, progress)
                flash("success", f"Release {rid} ran and was audited: it is now {out.state}.")
                st.rerun()
    elif state == "checked":
        if st.button(
            "Publish (sign the bundle)",
            key=f"publish_{rid}",
            type="primary",
            icon=":material/publish:",
        ):
            with st.spinner("Writing and signing the bundle…"), guarded("publishing"):
                manager.publish(store, rid, ident.name)
                flash("success", f"Published {rid}: see Downloads.")
                st.rerun()


def parameters(store: Store, rel: Release, internal: bool) -> None:
    res = rel.result
    st.markdown("**Guarantee**")
    st.json(
        (res.guarantee if res else None) or {"planned_epsilon_after": rel.plan.epsilon_after},
        expanded=True,
    )
    st.markdown("**Parameters**")
    st.json((res.parameters if res else None) or rel.plan.config or {}, expanded=False)
    if internal:
        st.markdown("**Plan**")
        st.caption(f"Digest `{rel.plan_digest}`; events: " + "; ".join(rel.plan.events_described))
        rows = manager.approvals(store, rel.release_id)
        if rows:
            st.markdown("**Approvals**")
            st.dataframe(
                pd.DataFrame(
                    [
                        {
                            "steward": a["approver"],
                            "decision": a["decision"],
                            "reason": a["reason"] or "",
                            "signature": a["signature"][:24] + "…",
                            "decided (UTC)": short_time(a["decided_at"]),
                        }
                        for a in rows
                    ]
                ),
                hide_index=True,
                width="stretch",
            )


def audit_section(store: Store, rid: str, internal: bool) -> None:
    report = views.audit_report(store, rid)
    if report is None:
        st.info("Not audited yet: the audit runs after synthesis.")
        return
    (st.success if report.passed else st.error)(
        f"Audit {'passed' if report.passed else 'FAILED'} ({len(report.results)} checks, "
        f"{len(report.failures)} failed), checked {short_time(report.checked_at)} UTC."
    )
    run = manager.get_release(store, rid).result
    # a face recogniser's row says whether the mechanism searched against it or it was held out
    parameters = dict(run.parameters) if run else {}
    if not internal:
        _verdicts_only(report, parameters)
        return
    kinds = sorted(
        {r.kind for r in report.results},
        key=["expectations", "attack", "fidelity", "utility"].index,
    )
    for kind in kinds:
        _kind_section(kind, [r for r in report.results if r.kind == kind], parameters)


def _verdicts_only(report: AuditReport, parameters: dict) -> None:
    """Consumers' table: the verdicts only, never what was computed on sensitive data."""
    # Consumers get verdicts only: summaries, details and plots are computed on sensitive data.
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "check": k,
                    "verdict": VERDICT_ICON.get(v, v),
                    "note": verdict_note(k, parameters),
                }
                for k, v in report.verdicts().items()
            ]
        ),
        hide_index=True,
        width="stretch",
    )


def _kind_section(kind: str, results: list, parameters: dict) -> None:
    """One kind of check in an expander: its table, then each check's plots and details."""
    fails = sum(r.passed is False for r in results)
    title = {
        "expectations": "Expectations (Great Expectations)",
        "attack": "Attacks",
        "fidelity": "Fidelity",
        "utility": "Utility",
    }[kind]
    with st.expander(
        f"{title}: {len(results)} checks, {fails} failed",
        expanded=kind != "expectations" or fails > 0,
    ):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "check": r.name,
                        "verdict": VERDICT_ICON.get(r.verdict, r.verdict),
                        "note": verdict_note(r.name, parameters),
                        "summary": r.summary,
                    }
                    for r in results
                ]
            ),
            hide_index=True,
            width="stretch",
        )
        if kind == "expectations":
            return
        for r in results:
            for label, path in r.artifacts.items():
                if Path(path).is_file():
                    st.image(str(path), caption=f"{r.name}: {label}", width=560)
            if r.details:
                with st.popover(f"Details of {r.name}"):
                    st.json(r.details, expanded=False)


def samples(store: Store, rid: str) -> None:
    if not manager.get_release(store, rid).result:
        st.info("No images yet: the release has not been synthesised.")
        return
    out = views.load_output(store, rid)
    images, labels = out.images, out.labels
    n = min(SAMPLE_COUNT, len(images))
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(len(images), n, replace=False)) if len(images) > n else np.arange(n)
    st.image(
        image_grid(images[idx], columns=10, scale=3),
        caption=(
            f"{n} of {len(images)} released images; labels: "
            f"{', '.join(str(int(x)) for x in labels[idx])}"
        ),
    )


def _has_clusters(store: Store, rel: Release) -> bool:
    return bool(rel.result) and views.load_output(store, rel.release_id).clusters is not None


def _sensitive_images(store: Store, name: str, fingerprint: str) -> np.ndarray:
    """Kept for this browser session only (never in a process-wide cache of the server); the read
    checks the content is the registered one."""
    key = f"sensitive:{store.workspace.root}:{name}:{fingerprint}"
    if key not in st.session_state:
        st.session_state[key] = views.sensitive_images(store, name)
    return st.session_state[key]


def cluster_viewer(store: Store, ident: keys.Identity, rel: Release) -> None:
    """The k sensitive records beside the representative released for them (steward/auditor
    only)."""
    keys.require_role(ident, *INTERNAL_ROLES)
    out = views.load_output(store, rel.release_id)
    clusters, images, labels, dist = out.clusters, out.images, out.labels, out.label_distributions
    if (
        clusters is None
    ):  # only k-anonymous releases keep clusters (the tab is shown for those only)
        st.info("This release keeps no clusters.")
        return
    ds = views.dataset(store, rel.dataset_id)
    sensitive = _sensitive_images(store, ds.name, ds.fingerprint)
    st.caption(
        "Internal: the sensitive source records of each "
        "released representative. Never shown to consumers."
    )
    i = st.number_input(
        f"Cluster (0–{len(clusters) - 1})",
        min_value=0,
        max_value=len(clusters) - 1,
        value=0,
        step=1,
        key=f"cluster_{rel.release_id}",
    )
    members = np.asarray(clusters[int(i)], dtype=np.int64)
    left, right = st.columns([1, 4])
    with left:
        st.image(
            to_display(images[int(i)][None])[0]
            .repeat(display_scale(images.shape[1], images.shape[2], 4), 0)
            .repeat(display_scale(images.shape[1], images.shape[2], 4), 1),
            caption=f"representative (label {int(labels[int(i)])})",
        )
    with right:
        st.image(
            image_grid(sensitive[members], columns=len(members), scale=4),
            caption=f"its {len(members)} sources: records {', '.join(map(str, members))}",
        )
    if dist is not None:
        st.caption(
            "Aggregated label distribution: "
            + ", ".join(f"{c}: {p:.2f}" for c, p in enumerate(dist[int(i)]) if p)
        )
