"""Read-only views of a workspace for display (the dashboard, `release status`): its datasets, audit
trail, audit reports, where a release's run stands and, for stewards and auditors, a registered
dataset's images and a release's saved output (release.artifacts). Nothing here writes; the
release lifecycle is `release.manager`, the budget figures `release.budget`. The dashboard imports
release only, so these are the accounting and audit reads it shows, in one place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from accounting import ledger, trail
from accounting.errors import PrivReleaseError
from accounting.ledger import Dataset
from accounting.store import Store, Workspace
from audit.report import AuditReport, load_report
from release import runner
from release.artifacts import load_output, release_dir
from release.attempts import Attempt
from release.attempts import history as attempts  # a release's run attempts, oldest first
from release.data import load_registered
from release.manifest import STATEMENT_FILE
from release.predicate import ReleasePredicate
from release.records import Release, get_release
from synth import registry
from synth.kinds.datasets import ImageDataset
from synth.registry import guarantee_label

__all__ = [  # guarantee_label: the dashboard's words for a guarantee kind (synth.registry);
    # load_output: a release's saved output, typed (release.artifacts)
    "Attempt",
    "AuditReport",
    "Dataset",
    "PrivReleaseError",
    "Store",
    "attempts",
    "audit_report",
    "guarantee_label",
    "load_output",
    "dataset",
    "datasets",
    "open_store",
    "published_predicate",
    "run_status",
    "sensitive_images",
    "trail_entries",
    "verify_trail",
]


def open_store(root: str | Path) -> Store:
    """The store of the workspace at `root`."""
    return Store(Workspace(root))


def datasets(store: Store) -> list[Dataset]:
    """Every registered dataset, oldest first."""
    return ledger.list_datasets(store)


def dataset(store: Store, name_or_id: str) -> Dataset:
    return ledger.get_dataset(store, name_or_id)


def verify_trail(store: Store) -> trail.TrailVerification:
    """The audit trail's chain and head, checked (what `privrelease audit verify` reports)."""
    return trail.verify(store)


def trail_entries(store: Store) -> list[dict]:
    """Every trail entry, newest first: seq, ts, actor, action, payload (parsed), entry_hash."""
    return trail.entries(store)


def audit_report(store: Store, release_id: str) -> AuditReport | None:
    """The stored audit of a release (internal: summaries and details are computed on sensitive
    data), or None."""
    return load_report(store, release_id)


def sensitive_images(store: Store, name: str) -> np.ndarray:
    """The registered dataset's images, checked to be the registered content (steward and auditor
    views only)."""
    data = load_registered(store, name)[1]
    if not isinstance(data, ImageDataset):
        raise PrivReleaseError(f"Dataset {name!r} holds {registry.data_kind(data)}, not images.")
    return data.images


def published_predicate(rel: Release) -> ReleasePredicate | None:
    """The predicate signed into a published release's bundle, as the bundle states it (None before
    publication or if the bundle folder is gone). Displayed, not verified: consumers verify with
    `privrelease verify`."""
    path = Path(rel.bundle["path"]) / STATEMENT_FILE if rel.bundle else None
    if path is None or not path.is_file():
        return None
    statement = json.loads(path.read_text())
    return ReleasePredicate.from_json(
        statement.get("predicate"), statement.get("predicateType", "")
    )


def run_status(store: Store, release_id: str) -> runner.RunStatus:
    """Where a failed or interrupted release's run stands (its charge, data read, DP-SGD steps
    started)."""
    rel = get_release(store, release_id)
    return runner.run_status(
        store,
        run_id=release_id,
        dataset=rel.plan.dataset_id,
        plan=rel.plan.mechanism_view(),
        workdir=release_dir(store, release_id) / "work",
    )
