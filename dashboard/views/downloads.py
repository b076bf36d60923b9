"""Downloads: published bundles with their card, a download button, the public key and how to
verify."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.common import short_time
from release import keys, manager, views
from release.bundle import GRID_FILE
from release.card import split_front_matter
from release.records import Release
from release.views import Store


def render(store: Store, ident: keys.Identity) -> None:
    st.title(":material/download: Downloads")
    published = [r for r in manager.list_releases(store, ident) if r.state == "published"]
    public_key_panel(store)
    if not published:
        st.info("No published bundles yet.")
        return
    for rel in published:
        bundle_card(rel)


def public_key_panel(store: Store) -> None:
    pub_path = keys.public_key_path(store.workspace, keys.RELEASE_KEY)
    with st.container(border=True):
        st.markdown("#### :material/key: Publisher's public key")
        if not pub_path.is_file():
            st.info(
                "No release key yet: it is created with the "
                "first identity or the first signed release."
            )
            return
        pem = pub_path.read_text()
        left, right = st.columns([3, 1])
        left.code(pem, language="text")
        right.download_button(
            "release.pub",
            data=pem,
            file_name="release.pub",
            mime="application/x-pem-file",
            key="dl_pub",
            icon=":material/key:",
            width="stretch",
        )
        st.caption(
            f"Key id (sha256 of the raw Ed25519 key): `{keys.key_id(pub_path)}`. Compare it with "
            "the key id the publisher announced through another channel before trusting a bundle."
        )


def bundle_card(rel: Release) -> None:
    rid, b = rel.release_id, rel.bundle or {}
    # what the bundle asserts: its image count and guarantee
    signed = views.published_predicate(rel)
    count = signed.released_image_count if signed else (rel.result.count if rel.result else None)
    guarantee = (signed.guarantee if signed else rel.guarantee).get("description", "")
    tarball = Path(b["tarball"])
    with st.container(border=True):
        head, button = st.columns([3, 1.2])
        head.markdown(f"#### {rid} · {guarantee}")
        head.caption(
            f"Published {short_time(rel.updated_at)} UTC · {'?' if count is None else count} "
            f"images · dataset `{rel.dataset_id}`"
        )
        if tarball.is_file():
            button.download_button(
                f"{tarball.name} ({tarball.stat().st_size / 1024:.0f} KiB)",
                data=tarball.read_bytes(),
                file_name=tarball.name,
                mime="application/gzip",
                key=f"dl_{rid}",
                type="primary",
                icon=":material/download:",
                width="stretch",
            )
        else:
            button.error(f"The archive {tarball.name} is missing on the server.")
        st.markdown("**Verify offline** (needs only the bundle and `release.pub`):")
        st.code(
            f"sha256sum {tarball.name}\n# expect {b['tarball_sha256']}\nprivrelease verify "
            f"{tarball.name} --key release.pub",
            language="bash",
        )
        st.caption(
            "`privrelease verify` checks the DSSE (Ed25519) signature over the in-toto manifest "
            "and the sha256 of every file in the bundle; it exits non-zero if anything was changed."
        )
        card = Path(b["path"]) / "README.md"
        with st.expander("Dataset card (README.md in the bundle)", icon=":material/description:"):
            if not card.is_file():
                st.markdown("_The card is missing from the bundle._")
            else:
                # the YAML front matter is for `datasets`; the grid is shown as an image, not a
                # relative link
                body = split_front_matter(card.read_text())[1].replace(
                    "![sample grid](sample_grid.png)", ""
                )
                grid = Path(b["path"]) / GRID_FILE
                if grid.is_file():
                    st.image(str(grid), caption="sample_grid.png: a few images per class")
                st.markdown(body)
