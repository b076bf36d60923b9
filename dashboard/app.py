"""privrelease dashboard (Streamlit): sign-in, then the pages the signed-in role may see.

Run with `privrelease dashboard` (sets PRIVRELEASE_HOME). Every change goes through release/'s API,
which enforces roles itself; the dashboard also hides what a role may not do.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (
    None,
    "",
):  # `streamlit run dashboard/app.py` puts dashboard/, not the repo, on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402

from dashboard.common import (  # noqa: E402
    PAGE_ICONS,
    ROLE_BADGE,
    get_store,
    guarded,
    pages_for,
    show_flash,
)
from dashboard.views import audit_trail, downloads, ledger, overview, releases  # noqa: E402
from release import (
    auth,  # noqa: E402
    keys,  # noqa: E402
)
from release.views import PrivReleaseError, Store  # noqa: E402

VIEWS = {
    "Overview": overview,
    "Ledger": ledger,
    "Releases": releases,
    "Audit trail": audit_trail,
    "Downloads": downloads,
}

CSS = """
<style>
.block-container {padding-top: 2.2rem; max-width: 1300px;}
div[data-testid="stMetric"] {
  background: #f6f8fa; border: 1px solid #e3e8ee; border-radius: 10px; padding: 10px 14px;
}
.pr-muted {color: #52606d; font-size: 0.9rem;}
[data-testid="stAppDeployButton"] {display: none;}
</style>
"""


def current_identity(store: Store) -> keys.Identity | None:
    """The signed-in identity, re-read from the store on every run: a deleted identity, or one whose
    password changed since this session signed in, is signed out."""
    name = st.session_state.get("user")
    if not name:
        return None
    ident = auth.session_valid(store, name, st.session_state.get("epoch", ""))
    if ident is None:
        for k in ("user", "epoch", "page", "release"):
            st.session_state.pop(k, None)
        st.session_state["signed_out"] = (
            "Your session ended (the identity's password changed): sign in again."
        )
    return ident


def sign_in(store: Store) -> None:
    _, mid, _ = st.columns([1, 1.3, 1])
    with mid:
        st.markdown("## :material/shield_lock: privrelease")
        st.markdown(
            '<p class="pr-muted">Privacy-accounted releases of image datasets. Sign in with the '
            "identity and password the CLI created (<code>privrelease keys create</code>, "
            "<code>privrelease keys password</code>).</p>",
            unsafe_allow_html=True,
        )
        prefill = st.query_params.get("user", "")  # only pre-fills the form; never signs anyone in
        with st.form("sign_in"):
            name = st.text_input(
                "Identity", value=prefill, key="login_name", placeholder="e.g. alice"
            )
            password = st.text_input("Password", type="password", key="login_password")
            submitted = st.form_submit_button("Sign in", type="primary", width="stretch")
        notice = st.session_state.pop("signed_out", None)
        if notice and not submitted:
            st.warning(notice, icon=":material/logout:")
        if submitted:
            # throttled; every attempt is an audit-trail entry
            result = auth.sign_in(store, name, password)
            if result.identity is None:
                st.error(result.message, icon=":material/block:")
            else:
                ident = result.identity
                st.session_state["user"], st.session_state["epoch"] = (
                    ident.name,
                    result.session_epoch,
                )
                # ?page=NAME deep-links to a page; one the role may not open is refused with a
                # message
                st.session_state["page"] = st.query_params.get("page", "Overview")
                st.rerun()


def sidebar(store: Store, ident: keys.Identity) -> tuple[str, str | None]:
    """Navigation limited to the role's pages; returns (page, refused page or None)."""
    allowed = pages_for(ident.role)
    requested = st.session_state.get("page")
    refused = requested if requested is not None and requested not in allowed else None
    if requested not in allowed:
        st.session_state["page"] = allowed[0]
    with st.sidebar:
        st.markdown("### :material/shield_lock: privrelease")
        st.markdown(f"Signed in as **{ident.name}**  \n{ROLE_BADGE.get(ident.role, ident.role)}")
        st.radio(
            "Page",
            allowed,
            key="page",
            format_func=lambda p: f"{PAGE_ICONS.get(p, '')} {p}",
            label_visibility="collapsed",
        )
        st.divider()
        if st.button("Sign out", width="stretch"):
            for k in ("user", "epoch", "page", "release"):
                st.session_state.pop(k, None)
            st.rerun()
        st.caption(f"Workspace: `{store.workspace.root}`")
    return st.session_state["page"], refused


def main() -> None:
    st.set_page_config(
        page_title="privrelease dashboard", page_icon=":material/shield_lock:", layout="wide"
    )
    st.markdown(CSS, unsafe_allow_html=True)
    try:
        store = get_store()
    except PrivReleaseError as exc:
        st.error(str(exc), icon=":material/block:")
        return
    ident = current_identity(store)
    if ident is None:
        sign_in(store)
        return
    page, refused = sidebar(store, ident)
    if refused is not None:
        # Only a known page name is echoed: any other ?page= value is attacker-chosen text (a link,
        # markup).
        what = (
            f"The {refused} page is"
            if refused in VIEWS
            else "The requested page does not exist or is"
        )
        st.error(
            f"{what} not available to a {ident.role}. You can open: "
            f"{', '.join(pages_for(ident.role))}.",
            icon=":material/block:",
        )
        return
    show_flash()
    with guarded(f"showing {page}"):
        VIEWS[page].render(store, ident)


main()
