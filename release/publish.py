"""The signed bundle of a checked release (release.bundle writes it): refused unless the audit
passed and the store verifies; the release predicate it signs (what the release is, what it cost,
where the ledger stood), its card and its columns. release.manager records the state change
(`publish`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import numpy as np

from accounting import ledger, trail
from accounting.errors import LedgerStateError, PermissionDeniedError, TamperError
from accounting.integrity import verify_store
from accounting.store import Store
from release.artifacts import (
    load_extra_images,
    load_release_data,
    release_dir,
    release_ids,
    saved_kind,
)
from release.predicate import Approval, LedgerPosition, ReleasePredicate
from release.records import Release, RunRecord, approvals

if TYPE_CHECKING:
    from audit import AuditReport

TOOL = "privrelease"


def write_release_bundle(store: Store, rel: Release) -> tuple[dict[str, str], RunRecord]:
    """Build the signed bundle of `rel` (checked, its approval verified); refuses unless every
    thresholded audit check passed and the store verifies. Returns the bundle's paths and digests
    and the run record they belong to."""
    from release.bundle import write_bundle
    from release.card import card_for

    release_id = rel.release_id
    report = _passed_report(store, release_id)
    images, labels, dist = load_release_data(store, release_id)
    ds = ledger.get_dataset(store, rel.dataset_id)
    integrity = verify_store(store)  # chain, head and the ledger replayed from the trail
    if not integrity.ok:
        raise TamperError(
            "The audit trail or the ledger was altered ("
            + "; ".join(integrity.all_problems[:3])
            + "); publishing is refused until `privrelease audit verify` passes."
        )
    res = rel.result
    if res is None:
        raise LedgerStateError(f"Release {release_id} has not been synthesised yet; run it first.")
    predicate = release_predicate(
        store, rel, res, ds, report.verdicts(), len(images), integrity.trail
    )
    card = card_for(rel.to_dict(), asdict(ds), predicate)
    extra: dict[str, np.ndarray] = {"label_distribution": dist} if dist is not None else {}
    extra.update(load_extra_images(store, release_id))
    # what the output kind adds (e.g. one file per row, and a column naming it); its fingerprint
    # is checked first: what is bundled is what the run saved
    parts = saved_kind(store, release_id, res.mechanism).bundle(
        release_dir(store, release_id), release_ids(release_id, len(images))
    )
    extra.update(parts.columns)
    files = dict(parts.files) or None
    info = write_bundle(
        store.workspace.bundles / release_id,
        images=images,
        labels=labels,
        ids=release_ids(release_id, len(images)),
        card_markdown=card,
        predicate=predicate,
        workspace=store.workspace,
        extra_columns=extra or None,
        extra_files=files,
    )
    bundle = {
        "path": str(info.path),
        "tarball": str(info.tarball),
        "tarball_sha256": info.tarball_sha256,
        "manifest_digest": info.manifest_digest,
        "key_id": info.key_id,
        "public_key": str(info.public_key_path),
    }
    return bundle, res


def _passed_report(store: Store, release_id: str) -> AuditReport:
    """The release's audit report, refused unless every thresholded check passed."""
    from audit import load_report

    report = load_report(store, release_id)
    if report is None:
        raise LedgerStateError(
            f"Release {release_id} has no audit report; run `privrelease audit run {release_id}`."
        )
    if not report.passed:
        names = ", ".join(f"{c.name} ({c.summary})" for c in report.failures)
        raise PermissionDeniedError(
            f"Release {release_id} failed its audit and cannot be published: {names}."
        )
    return report


def release_predicate(
    store: Store,
    rel: Release,
    res: RunRecord,
    ds: ledger.Dataset,
    verdicts: dict[str, str],
    n_images: int,
    head: trail.TrailVerification,
) -> ReleasePredicate:
    """The signed predicate of a release being published: what it is, what it cost, where the ledger
    stood."""
    from release.card_history import ledger_history

    charge = ledger.get_charge(store, res.charge_id or rel.release_id)
    return ReleasePredicate(
        release_id=rel.release_id,
        dataset_id=ds.dataset_id,
        mechanism=res.mechanism,
        parameters=res.parameters,
        guarantee=res.guarantee,
        released_image_count=int(n_images),
        privacy_unit=ds.privacy_unit,
        dataset_size_public=True,
        events=res.executed_events,
        ledger_position=LedgerPosition(
            charge.position if charge else None, head.length, head.head_hash
        ),
        approval=Approval(
            rel.plan_digest,
            tuple(
                a["approver"]
                for a in approvals(store, rel.release_id)
                if a["decision"].startswith("approve")
            ),
        ),
        audit_verdicts=verdicts,
        tool={"name": TOOL, "version": package_version()},
        history=ledger_history(store, ds.dataset_id),  # whole ledger: consumers recompute epsilon
    )


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("privrelease")
    except PackageNotFoundError:
        return "0+unknown"
