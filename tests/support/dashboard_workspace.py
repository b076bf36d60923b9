"""Builds realistic dashboard workspaces through the real APIs (no mocks): identities with passwords,
registered datasets, ledger charges, release plans and (optionally) one real, published k-SALSA release.
Imported by the dashboard tests (it holds no tests itself)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from accounting import ledger  # noqa: E402
from accounting.events import DpSgd, GaussianQuery  # noqa: E402
from accounting.store import Store, Workspace  # noqa: E402
from release import keys, manager  # noqa: E402
from release.auth import set_password  # noqa: E402
from release.data import register_from_source  # noqa: E402
from release.spec import ReleaseSpec  # noqa: E402
from synth.kinds.datasets import load_source  # noqa: E402

PASSWORDS = {"alice": "steward-pass-1", "bob": "auditor-pass-1", "carol": "consumer-pass-1"}
ROLES = {"alice": "steward", "bob": "auditor", "carol": "consumer"}
KSALSA_SPEC = {
    "release": {"dataset": "mnist", "mechanism": "ksalsa", "description": "k-anonymous digits"},
    "ksalsa": {"k": 5, "preset": "tiny"},
}


APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


@dataclass
class Built:
    store: Store
    root: Path
    planned: list[str] = field(default_factory=list)
    published: str | None = None


# Small audit budgets keep the real audit of the small release to seconds.
# 12 representatives of 60 images cannot train a useful classifier: the utility gate is off here (it has its
# own tests in test_audit_utility_gate.py)
FAST_POLICY = {
    "feature_samples": 60,
    "fid_samples": 60,
    "utility_train_samples": 60,
    "cnn_epochs": 1,
    "min_utility_gain": None,
}


def ksalsa_spec(
    dataset: str = "mnist", k: int = 5, policy: dict | None = None, **release: object
) -> ReleaseSpec:
    spec = {
        "release": {**KSALSA_SPEC["release"], "dataset": dataset, **release},
        "ksalsa": {"k": k, "preset": "tiny"},
        "policy": policy or {},
    }
    return ReleaseSpec.from_dict(spec)


def build_workspace(root: Path, *, run_release: bool = False) -> Built:
    ws = Workspace(root)
    ws.init()
    store = Store(ws)
    for name, role in ROLES.items():
        keys.create_identity(store, name, role)
        set_password(store, name, PASSWORDS[name])
    keys.ensure_release_key(ws)
    register_from_source(store, "mnist", "builtin:mnist5k", 8.0, 1e-5, actor="alice")
    # Ledger history on mnist: a DP query and a DP-SGD run (committed), one refunded run.
    ledger.reserve(
        store,
        "mnist",
        [GaussianQuery(20.0)],
        "run-query-1",
        description="semantic query",
        actor="alice",
    )
    ledger.commit(store, "run-query-1", [GaussianQuery(20.0)], actor="alice")
    ledger.reserve(
        store,
        "mnist",
        [DpSgd(0.01, 1.2, 300)],
        "run-sgd-1",
        description="DP-SGD fine-tune",
        actor="alice",
    )
    ledger.commit(store, "run-sgd-1", [DpSgd(0.01, 1.2, 200)], actor="alice")
    ledger.reserve(
        store,
        "mnist",
        [DpSgd(0.01, 1.5, 100)],
        "run-sgd-2",
        description="aborted run",
        actor="alice",
    )
    ledger.refund(store, "run-sgd-2", reason="failed before reading data", actor="alice")
    built = Built(store, root)
    built.planned.append(manager.create_plan(store, ksalsa_spec(), "alice").release_id)
    if run_release:
        built.published = publish_small_release(store, root)
    return built


def approved_small_release(store: Store, root: Path) -> str:
    """Register a 60-image MNIST subset and plan + approve a tiny k-SALSA release of it; returns its id."""
    mnist = load_source("builtin:mnist5k")
    idx = np.concatenate([np.flatnonzero(mnist.labels == c)[:6] for c in range(10)])
    path = root.parent / "mnist-small.npz"
    np.savez(path, images=mnist.images[idx], labels=mnist.labels[idx])
    register_from_source(store, "mnist-small", str(path), 4.0, 1e-4, labels="0-9", actor="alice")
    spec = ksalsa_spec(
        "mnist-small",
        policy=FAST_POLICY,
        heldout="builtin:mnist5k-heldout",
        description="small k-anonymous release",
    )
    rel = manager.create_plan(store, spec, "alice")
    rid = rel.release_id
    manager.approve(store, rid, "alice", digest=rel.plan_digest, acknowledge_non_dp=True)
    return rid


def publish_small_release(store: Store, root: Path) -> str:
    """A real, audited, signed k-SALSA release of the small subset (about a minute on 2 shared cores)."""
    rid = approved_small_release(store, root)
    manager.run_release(store, rid, "alice")
    manager.publish(store, rid, "alice")
    return rid


# ------------------------------------------------------------------ AppTest helpers
def new_app(timeout: float = 120):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(APP, default_timeout=timeout)


def sign_in(name: str, page: str | None = None, password: str | None = None):
    """A fresh app session signed in through the real form (scrypt check), landing on `page` (a ?page= deep
    link, as a bookmarked URL would)."""
    at = submit_sign_in(name, page, password)
    assert at.session_state["page"] == (page or "Overview")
    return at


def submit_sign_in(name: str, page: str | None = None, password: str | None = None):
    """A fresh app session signed in through the real form, opened at a ?page= deep link, wherever the app
    then lands (a page the role may not open is refused after signing in)."""
    at = new_app()
    if page is not None:
        at.query_params["page"] = page
    at.run()
    at.text_input(key="login_name").input(name)
    at.text_input(key="login_password").input(PASSWORDS[name] if password is None else password)
    at.button[0].click().run()
    assert_clean(at)
    assert at.session_state["user"] == name
    return at


def assert_clean(at) -> None:
    """No uncaught exception (tracebacks) in the app."""
    assert not at.exception, [e.value for e in at.exception]


def nodes(at, kind: str) -> list:
    """Every element of a proto type ('image', 'download_button', 'vega_lite_chart', ...), in page order."""
    out = []

    def walk(node) -> None:
        if getattr(node, "type", None) == kind:
            out.append(node)
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return out


def image_captions(at) -> list[str]:
    return [img.caption for node in nodes(at, "image") for img in node.proto.imgs]


def texts(at) -> str:
    """All visible text of the main area and sidebar (titles, markdown, captions, alerts, metrics)."""
    parts = []
    for kind in (
        "title",
        "header",
        "subheader",
        "markdown",
        "caption",
        "error",
        "warning",
        "info",
        "success",
        "code",
    ):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [f"{m.label}: {m.value}" for m in at.metric]
    return "\n".join(parts)
