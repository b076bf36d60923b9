"""A real release driven from the dashboard (AppTest): the steward runs an approved tiny k-SALSA release
(progress shown) and publishes it; then its detail page (parameters, audit report, samples, cluster
viewer) and the Downloads page are checked for every role. Slow: about a minute on 2 shared cores."""

from __future__ import annotations

import hashlib

import pytest
import torch

from audit import load_report
from release import artifacts, manager
from release.card import split_front_matter
from tests.support.dashboard_workspace import (
    approved_small_release,
    assert_clean,
    build_workspace,
    image_captions,
    nodes,
    sign_in,
    texts,
)

pytestmark = pytest.mark.slow
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Workspace + the small release, run and published by clicking through the dashboard as the steward."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("dashrel") / "ws"
    built = build_workspace(root)
    mp.setenv("PRIVRELEASE_HOME", str(root))
    rid = approved_small_release(built.store, root)
    at = sign_in("alice", "Releases")
    at.selectbox(key="release").set_value(rid).run()
    at.button(key=f"run_{rid}").click().run(timeout=600)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any(
        f"Release {rid} ran and was audited: it is now checked" in s.value for s in at.success
    )
    assert manager.get_release(built.store, rid).state == "checked"
    at.button(key=f"publish_{rid}").click().run(timeout=300)
    assert_clean(at)
    assert any(f"Published {rid}" in s.value for s in at.success)
    yield built, rid
    mp.undo()


@pytest.fixture(autouse=True)
def home(published, monkeypatch):
    monkeypatch.setenv("PRIVRELEASE_HOME", str(published[0].root))


def _detail(name: str, rid: str):
    at = sign_in(name, "Releases")
    at.selectbox(key="release").set_value(rid).run()
    assert_clean(at)
    return at


@pytest.mark.parametrize("name", ["alice", "bob"])
def test_internal_roles_see_the_full_audit_report_and_clusters(published, name):
    built, rid = published
    rel = manager.get_release(built.store, rid)
    report = load_report(built.store, rid)
    at = _detail(name, rid)
    assert rel.state == "published"
    assert [t.label for t in at.tabs] == ["Parameters", "Audit report", "Samples", "Clusters"]
    text = texts(at)
    assert "Guarantee:** k-anonymous (k=5)" in text
    assert f"Audit passed ({len(report.results)} checks, 0 failed)" in text
    # Every check with its summary (internal), grouped by kind, and the audit's plots.
    shown = {
        row["check"]: row["summary"]
        for df in at.dataframe
        if "summary" in df.value
        for _, row in df.value.iterrows()
    }
    assert shown == {r.name: r.summary for r in report.results}
    plots = [p for r in report.results for p in r.artifacts.values()]
    images = nodes(at, "image")
    assert len(images) >= len(plots) + 3  # audit plots + sample grid + representative + its sources
    # Cluster viewer: the k sensitive sources beside the representative.
    clusters = artifacts.load_output(built.store, rid).clusters
    assert f"its 5 sources: records {', '.join(map(str, clusters[0]))}" in image_captions(at)
    at.number_input(key=f"cluster_{rid}").set_value(3).run()
    assert f"its 5 sources: records {', '.join(map(str, clusters[3]))}" in image_captions(at)
    # The approval signature is listed; a published release offers no more steward actions.
    approvals = [df.value for df in at.dataframe if "decision" in df.value]
    assert len(approvals) == 1 and list(approvals[0]["decision"]) == ["approve-ack-non-dp"]
    assert not [b for b in at.button if b.key and b.key.startswith(("run_", "publish_"))]


def test_consumer_sees_verdicts_only(published):
    built, rid = published
    report = load_report(built.store, rid)
    at = _detail("carol", rid)
    assert [t.label for t in at.tabs] == [
        "Parameters",
        "Audit report",
        "Samples",
    ]  # no cluster viewer
    verdicts = [df.value for df in at.dataframe if "verdict" in df.value]
    # the note column says which face recognisers the mechanism searched against or held out (from
    # the release's public parameters, as the card does); nothing computed on sensitive data
    assert len(verdicts) == 1 and list(verdicts[0].columns) == ["check", "verdict", "note"]
    assert dict(zip(verdicts[0]["check"], verdicts[0]["verdict"])) == report.verdicts()
    assert not any(ch.isdigit() for note in verdicts[0]["note"] for ch in str(note))
    text = texts(at) + " ".join(str(df.value.to_dict()) for df in at.dataframe)
    for r in report.results:  # no summary, detail or plot computed on sensitive data
        assert r.summary not in text
    assert not any("sources" in c or "representative" in c for c in image_captions(at))
    assert "Plan**" not in text and "approve-ack" not in text
    assert len(nodes(at, "image")) == 1  # the grid of released samples only
    assert not any("plan_digest" in str(j.value) for j in at.json)


def test_downloads_offer_the_signed_bundle(published):
    built, rid = published
    bundle = manager.get_release(built.store, rid).result.bundle
    at = sign_in("carol", "Downloads")
    buttons = [d.proto.label for d in nodes(at, "download_button")]
    assert buttons[0] == "release.pub" and buttons[1].startswith(f"{rid}.tar.gz")
    code = " ".join(c.value for c in at.code)
    assert f"privrelease verify {rid}.tar.gz --key release.pub" in code
    tarball = open(bundle["tarball"], "rb").read()
    assert (
        hashlib.sha256(tarball).hexdigest() == bundle["tarball_sha256"]
        and bundle["tarball_sha256"] in code
    )
    card = open(f"{bundle['path']}/README.md").read()
    body = split_front_matter(card)[1].replace(
        "![sample grid](sample_grid.png)", ""
    )  # YAML is for `datasets`
    assert any(m.value.strip() == body.strip() for m in at.markdown)
    assert any("sample_grid.png" in c for c in image_captions(at))
