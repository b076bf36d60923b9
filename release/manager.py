"""The release lifecycle: spec -> plan -> approved (steward signature) -> running -> checked ->
published | failed | rejected. Every transition is one store transaction with an audit-trail entry;
the budget is reserved and settled by the mechanisms through the ledger (DESIGN.md rules 1-2)."""
from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from accounting import ledger, trail
from accounting.errors import LedgerStateError, PermissionDeniedError, PrivReleaseError, TamperError
from accounting.epsilon import epsilon_report
from accounting.events import event_from_json, event_to_json
from accounting.store import Store
from release import keys, mechanisms
from release.data import load_registered
from release.spec import ReleaseSpec
from synth.datasets import heldout_source, load_source
from synth.progress import ProgressFn, no_progress
from synth.result import SynthResult

STATES = ("planned", "approved", "rejected", "running", "checked", "published", "failed")
TOOL = "privrelease"


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def plan_digest(plan: dict) -> str:
    return hashlib.sha256(canonical(plan)).hexdigest()


def _approval_message(release_id: str, digest: str, decision: str, acknowledge_non_dp: bool) -> bytes:
    return canonical({"release_id": release_id, "plan_digest": digest, "decision": decision,
                      "acknowledge_non_dp": acknowledge_non_dp, "purpose": "privrelease plan approval"})


def _row_to_release(row: dict) -> dict:
    out = dict(row)
    for key in ("spec", "plan", "result"):
        out[key] = json.loads(out[key]) if out.get(key) else None
    return out


def get_release(store: Store, release_id: str) -> dict:
    rows = store.query("SELECT * FROM releases WHERE release_id = ?", [release_id])
    if not rows:
        raise PrivReleaseError(f"Unknown release {release_id!r}. See `privrelease release list`.")
    return _row_to_release(rows[0])


def list_releases(store: Store, viewer: keys.Identity | None = None) -> list[dict]:
    """All releases, newest first; a consumer sees only published ones."""
    rows = [_row_to_release(r) for r in store.query("SELECT * FROM releases ORDER BY created_at DESC")]
    if viewer is not None and viewer.role == "consumer":
        rows = [r for r in rows if r["state"] == "published"]
    return rows


def approvals(store: Store, release_id: str) -> list[dict]:
    return store.query("SELECT * FROM approvals WHERE release_id = ? ORDER BY decided_at", [release_id])


def _steward(store: Store, name: str) -> keys.Identity:
    return keys.require_role(keys.get_identity(store, name), "steward")


def _set_state(con, store: Store, release_id: str, expected: tuple[str, ...], new: str, actor: str, action: str,
               payload: dict, *, reason: str | None = None, result: dict | None = None) -> None:
    row = con.execute("SELECT state FROM releases WHERE release_id = ?", [release_id]).fetchone()
    if row is None:
        raise PrivReleaseError(f"Unknown release {release_id!r}.")
    if row[0] not in expected:
        raise LedgerStateError(f"Release {release_id} is {row[0]}; this needs it to be {' or '.join(expected)}.")
    sets, params = ["state = ?", "updated_at = ?"], [new, trail.now()]
    if reason is not None:
        sets.append("reason = ?")
        params.append(reason)
    if result is not None:
        sets.append("result = ?")
        params.append(json.dumps(result, sort_keys=True))
    con.execute(f"UPDATE releases SET {', '.join(sets)} WHERE release_id = ?", params + [release_id])
    trail.append(con, store, actor, action, {"release_id": release_id, "state": new, **payload})


# ------------------------------------------------------------------ plan
def create_plan(store: Store, spec: ReleaseSpec, actor: str) -> dict:
    """Store a plan: the events it will charge, epsilon before/after (RDP and PLD), warnings."""
    budget = ledger.budget(store, spec.dataset)
    ds = budget.dataset
    prior = budget.history
    mech = mechanisms.plan_mechanism(spec, ds, prior)
    events = [event_from_json(e) for e in mech["events"]]
    before = epsilon_report(prior, ds.delta_cap)
    after = epsilon_report(prior + events, ds.delta_cap)
    warnings = list(mech["warnings"])
    if budget.dp_void:
        warnings.append("A k-anonymous release was already made from this dataset: its DP guarantees no longer hold.")
    if spec.mechanism == "privimage" and after.epsilon_rdp > ds.epsilon_cap:
        warnings.append(f"Epsilon after this release ({after.epsilon_rdp:.3f}) exceeds the cap {ds.epsilon_cap:g}: "
                        "the run will be refused.")
    release_id = "rel-" + uuid.uuid4().hex[:10]
    plan = {
        "release_id": release_id, "dataset_id": ds.dataset_id, "dataset": ds.name, "mechanism": spec.mechanism,
        "events": mech["events"], "events_described": [e.describe() for e in events],
        "epsilon_before": before.as_dict(), "epsilon_after": after.as_dict(), "epsilon_cap": ds.epsilon_cap,
        "remaining_after_rdp": (ds.epsilon_cap - after.epsilon_rdp) if after.finite else None,
        "expected_count": mech["expected_count"], "warnings": warnings,
        "requires_acknowledgement": mech["requires_acknowledgement"], "config": mech["config"],
        "mechanism_plan": mech["mechanism_plan"], "public_source": spec.public_source,
        "ledger_position": len(budget.charges),
    }
    digest = plan_digest(plan)
    now = trail.now()
    with store.transaction() as con:
        con.execute("INSERT INTO releases VALUES (?, ?, ?, 'planned', ?, ?, ?, ?, ?, ?, NULL, NULL)",
                    [release_id, ds.dataset_id, spec.mechanism, json.dumps(spec.as_dict(), sort_keys=True),
                     json.dumps(plan, sort_keys=True), digest, actor, now, now])
        trail.append(con, store, actor, "release.plan", {"release_id": release_id, "plan_digest": digest,
                                                         "dataset_id": ds.dataset_id, "mechanism": spec.mechanism})
    return get_release(store, release_id)


# ------------------------------------------------------------------ approval
def _check_plan_intact(rel: dict) -> str:
    digest = plan_digest(rel["plan"])
    if digest != rel["plan_digest"]:
        raise TamperError(f"Release {rel['release_id']}: the stored plan no longer matches its digest (edited after "
                          "planning). Re-plan from the spec.")
    return digest


def approve(store: Store, release_id: str, steward: str, *, digest: str | None = None,
            acknowledge_non_dp: bool = False) -> dict:
    """A steward signs the plan's digest. `digest` (what the steward reviewed) must match the plan."""
    ident = _steward(store, steward)
    rel = get_release(store, release_id)
    current = _check_plan_intact(rel)
    if digest is not None and digest != current:
        raise TamperError(f"You reviewed plan digest {digest[:16]}… but release {release_id}'s plan is "
                          f"{current[:16]}…: a different or edited plan. Review it again before approving.")
    if rel["plan"]["requires_acknowledgement"] and not acknowledge_non_dp:
        raise PermissionDeniedError(
            f"Release {release_id} is k-anonymous: it carries no DP guarantee and voids the dataset's DP meaning "
            "(DESIGN.md rule 5). Approve with --acknowledge-non-dp to accept this explicitly.")
    sig = keys.sign(store.workspace, ident.name, _approval_message(release_id, current, "approve", acknowledge_non_dp))
    with store.transaction() as con:
        con.execute("INSERT INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [release_id, ident.name, "approve-ack-non-dp" if acknowledge_non_dp else "approve", current,
                     sig.hex(), None, trail.now()])
        _set_state(con, store, release_id, ("planned",), "approved", ident.name, "release.approve",
                   {"plan_digest": current, "signature": sig.hex(), "key_id": ident.key_id,
                    "acknowledge_non_dp": acknowledge_non_dp})
    return get_release(store, release_id)


def reject(store: Store, release_id: str, steward: str, reason: str) -> dict:
    ident = _steward(store, steward)
    if not reason.strip():
        raise PrivReleaseError("Give a reason for the rejection (it goes into the audit trail).")
    rel = get_release(store, release_id)
    digest = rel["plan_digest"]
    sig = keys.sign(store.workspace, ident.name, _approval_message(release_id, digest, "reject", False))
    with store.transaction() as con:
        con.execute("INSERT INTO approvals VALUES (?, ?, 'reject', ?, ?, ?, ?)",
                    [release_id, ident.name, digest, sig.hex(), reason, trail.now()])
        _set_state(con, store, release_id, ("planned", "approved"), "rejected", ident.name, "release.reject",
                   {"reason": reason}, reason=reason)
    return get_release(store, release_id)


def verified_approval(store: Store, rel: dict) -> dict:
    """The approval of this exact plan, with a valid steward signature; refuses anything else."""
    digest = _check_plan_intact(rel)
    for a in reversed(approvals(store, rel["release_id"])):
        if not a["decision"].startswith("approve"):
            continue
        ident = keys.get_identity(store, a["approver"])
        ack = a["decision"] == "approve-ack-non-dp"
        msg = _approval_message(rel["release_id"], digest, "approve", ack)
        if ident.role == "steward" and a["plan_digest"] == digest and \
                keys.verify_signature(ident.public_key, msg, bytes.fromhex(a["signature"])):
            return {**a, "acknowledge_non_dp": ack, "key_id": ident.key_id}
    raise TamperError(f"Release {rel['release_id']} has no valid steward approval of its current plan. "
                      "Approve it with `privrelease release approve`.")


# ------------------------------------------------------------------ run and audit
def release_dir(store: Store, release_id: str) -> Path:
    return store.workspace.artifacts / release_id


def _save_result(store: Store, release_id: str, result: SynthResult) -> dict:
    out = release_dir(store, release_id)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {"images": result.images, "labels": result.labels}
    if result.label_distributions is not None:
        arrays["label_distributions"] = result.label_distributions
    np.savez_compressed(out / "release.npz", **arrays)
    (out / "internal.json").write_text(json.dumps(result.internal, default=_jsonable))
    summary = {"mechanism": result.mechanism, "guarantee": result.guarantee, "parameters": result.parameters,
               "executed_events": [event_to_json(e) for e in result.executed_events],
               "artifacts": result.artifacts, "count": int(len(result.images))}
    return json.loads(json.dumps(summary, default=_jsonable))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    return str(obj)


def load_release_data(store: Store, release_id: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    with np.load(release_dir(store, release_id) / "release.npz") as z:
        return z["images"], z["labels"], (z["label_distributions"] if "label_distributions" in z else None)


def run_release(store: Store, release_id: str, actor: str, progress: ProgressFn = no_progress) -> dict:
    """Execute an approved plan (reserve -> synthesise -> commit, inside the mechanism), then audit it.
    A failed release can be run again: the mechanism resumes under the same run id (no double charge)."""
    ident = _steward(store, actor)
    rel = get_release(store, release_id)
    if rel["state"] not in ("approved", "failed", "running"):
        raise LedgerStateError(f"Release {release_id} is {rel['state']}; only an approved (or failed) release runs.")
    approval = verified_approval(store, rel)
    spec = ReleaseSpec.from_dict(rel["spec"])
    ds, data = load_registered(store, spec.dataset)
    with store.transaction() as con:
        _set_state(con, store, release_id, ("approved", "failed", "running"), "running", ident.name, "release.run", {})
    try:
        result = mechanisms.execute(store, rel, spec, ds, data, release_dir(store, release_id) / "work", progress,
                                    ident.name, approval["acknowledge_non_dp"])
        summary = _save_result(store, release_id, result)
    except BaseException as exc:
        with store.transaction() as con:
            _set_state(con, store, release_id, ("running",), "failed", ident.name, "release.fail",
                       {"reason": f"{type(exc).__name__}: {exc}"}, reason=f"{type(exc).__name__}: {exc}")
        raise
    with store.transaction() as con:
        _set_state(con, store, release_id, ("running",), "running", ident.name, "release.synthesised",
                   {"count": summary["count"], "guarantee": summary["guarantee"]}, result=summary)
    return audit_release(store, release_id, ident.name, progress, data=data)


def audit_release(store: Store, release_id: str, actor: str, progress: ProgressFn = no_progress, *,
                  data=None) -> dict:
    """Run every check on a synthesised release and store the (internal) report."""
    from audit import AuditInputs, AuditPolicy, run_audit, save_report

    ident = keys.require_role(keys.get_identity(store, actor), "steward", "auditor")
    rel = get_release(store, release_id)
    if rel["result"] is None:
        raise LedgerStateError(f"Release {release_id} has not been synthesised yet; run it first.")
    spec = ReleaseSpec.from_dict(rel["spec"])
    ds, sensitive = (ledger.get_dataset(store, spec.dataset), data) if data is not None \
        else load_registered(store, spec.dataset)
    images, labels, _ = load_release_data(store, release_id)
    res = rel["result"]
    g = res["guarantee"]
    internal = json.loads((release_dir(store, release_id) / "internal.json").read_text())
    heldout = spec_heldout(spec, ds)
    clusters = [np.asarray(c) for c in internal["clusters"]] if "clusters" in internal else None
    selected = _selected_public(spec, internal)
    loss_fn = mechanisms.loss_function(res["mechanism"], res["artifacts"])
    inputs = AuditInputs(
        release_id=release_id, images=images, labels=labels, ids=release_ids(release_id, len(images)),
        expected_count=int(rel["plan"]["expected_count"]), label_set=list(ds.labels), sensitive=sensitive,
        heldout=heldout, record_fingerprint_key=store.workspace.hmac_key(), mechanism=res["mechanism"],
        claimed_epsilon=g.get("epsilon_rdp"), delta=g.get("delta"), k=g.get("k"), loss_fn=loss_fn,
        clusters=clusters, selected_public=selected, artifacts_dir=release_dir(store, release_id) / "audit",
    )
    report = run_audit(inputs, AuditPolicy.from_dict(spec.policy), progress)
    save_report(store, report)
    with store.transaction() as con:
        _set_state(con, store, release_id, ("running", "checked", "failed"), "checked", ident.name, "release.audit",
                   {"passed": report.passed, "verdicts": report.verdicts()})
    return get_release(store, release_id)


def spec_heldout(spec: ReleaseSpec, ds: ledger.Dataset):
    source = spec.heldout or heldout_source(ds.source)
    return load_source(source) if source else None


def _selected_public(spec: ReleaseSpec, internal: dict):
    idx = internal.get("selected_public_indices")
    if idx is None:
        return None
    public = load_source(spec.public_source)
    return public.subset(np.asarray(idx, dtype=np.int64))


def release_ids(release_id: str, n: int) -> list[str]:
    return [f"{release_id}-{i:06d}" for i in range(n)]


# ------------------------------------------------------------------ publish
def publish(store: Store, release_id: str, actor: str) -> dict:
    """Build the signed bundle; refuses unless every thresholded audit check passed."""
    from audit import load_report
    from release.bundle import write_bundle
    from release.card import dataset_card
    from release.card_history import ledger_history

    ident = _steward(store, actor)
    rel = get_release(store, release_id)
    if rel["state"] != "checked":
        raise LedgerStateError(f"Release {release_id} is {rel['state']}; only a checked release can be published.")
    verified_approval(store, rel)
    report = load_report(store, release_id)
    if report is None:
        raise LedgerStateError(f"Release {release_id} has no audit report; run `privrelease audit run {release_id}`.")
    if not report.passed:
        names = ", ".join(f"{c.name} ({c.summary})" for c in report.failures)
        raise PermissionDeniedError(f"Release {release_id} failed its audit and cannot be published: {names}.")
    images, labels, dist = load_release_data(store, release_id)
    ds = ledger.get_dataset(store, rel["dataset_id"])
    head = trail.verify(store)
    if not head.ok:
        raise TamperError("The audit trail is broken; publishing is refused until `privrelease audit verify` passes.")
    charge = ledger.get_charge(store, release_id)
    res = rel["result"]
    verdicts = report.verdicts()
    predicate = {
        "release_id": release_id, "dataset_id": ds.dataset_id, "mechanism": res["mechanism"],
        "parameters": res["parameters"], "guarantee": res["guarantee"], "released_image_count": int(len(images)),
        "privacy_unit": ds.privacy_unit, "dataset_size_public": True,
        "events": res["executed_events"],
        "ledger_position": {"charge_position": charge.position if charge else None, "trail_seq": head.length,
                            "trail_head_sha256": head.head_hash},
        "approval": {"plan_digest": rel["plan_digest"], "steward": [a["approver"] for a in approvals(store, release_id)
                                                                   if a["decision"].startswith("approve")]},
        "audit_verdicts": verdicts, "tool": {"name": TOOL, "version": _version()},
        "history": ledger_history(store, ds.dataset_id),  # whole ledger: consumers recompute epsilon
    }
    card = dataset_card(rel, asdict(ds), res, len(images), verdicts, history=predicate["history"])
    extra = {"label_distribution": dist} if dist is not None else None
    info = write_bundle(store.workspace.bundles / release_id, images=images, labels=labels,
                        ids=release_ids(release_id, len(images)), card_markdown=card, predicate=predicate,
                        workspace=store.workspace, extra_columns=extra)
    bundle = {"path": str(info.path), "tarball": str(info.tarball), "tarball_sha256": info.tarball_sha256,
              "manifest_digest": info.manifest_digest, "key_id": info.key_id, "public_key": str(info.public_key_path)}
    with store.transaction() as con:
        _set_state(con, store, release_id, ("checked",), "published", ident.name, "release.publish", bundle,
                   result={**res, "bundle": bundle})
    return get_release(store, release_id)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("privrelease")
    except PackageNotFoundError:
        return "0+unknown"
