"""What runs is what was signed (ARCHITECTURE.md, rule 8): the message a steward signs to approve or
reject a plan, the check that a release's plan and spec are still the signed ones, the approval
verified under the steward's key recorded in the trail, and the inputs a run reads (spec file,
dataset, public data) checked against the signed plan before any sensitive data is used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accounting import ledger, trail
from accounting.errors import InvalidParameterError, TamperError
from accounting.store import Store
from release import keys
from release.artifacts import public_sha256
from release.data import load_registered
from release.records import Release, approvals
from release.spec import Plan, ReleaseSpec, canonical
from synth.kinds.datasets import load_public
from synth.registry import Data


def approval_message(
    release_id: str, digest: str, decision: str, acknowledge_non_dp: bool, key_id: str
) -> bytes:
    return canonical(
        {
            "release_id": release_id,
            "plan_digest": digest,
            "decision": decision,
            "key_id": key_id,
            "acknowledge_non_dp": acknowledge_non_dp,
            "purpose": "privrelease plan approval",
        }
    )


def sign_approval(
    store: Store, ident: keys.Identity, release_id: str, digest: str, acknowledge_non_dp: bool
) -> bytes:
    """The steward's signature approving plan `digest`, refused unless it verifies under the
    public key registered for the steward."""
    msg = approval_message(release_id, digest, "approve", acknowledge_non_dp, ident.key_id)
    sig = keys.sign(store.workspace, ident.name, msg)
    if not keys.verify_signature(ident.public_key, msg, sig):
        raise TamperError(
            f"{ident.name}'s private key does not match the public key registered for "
            f"{ident.name}; the key files or the store were changed. Nothing was approved."
        )
    return sig


def record_decision(
    con: Any,
    release_id: str,
    steward: str,
    action: str,
    digest: str,
    sig: bytes,
    reason: str | None,
) -> None:
    """The steward's signed decision as a row of `approvals`, in the caller's transaction."""
    con.execute(
        "INSERT INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?)",
        [release_id, steward, action, digest, sig.hex(), reason, trail.now()],
    )


def sign_rejection(store: Store, ident: keys.Identity, release_id: str, digest: str) -> bytes:
    """The steward's signature rejecting plan `digest`."""
    message = approval_message(release_id, digest, "reject", False, ident.key_id)
    return keys.sign(store.workspace, ident.name, message)


def check_plan_intact(rel: Release) -> str:
    """The plan's digest, refused if the stored plan or spec was edited after planning."""
    digest = rel.plan.digest
    if digest != rel.plan_digest:
        raise TamperError(
            f"Release {rel.release_id}: the stored plan no longer matches its digest (edited after "
            "planning). Re-plan from the spec."
        )
    if rel.spec != rel.plan.spec:
        raise TamperError(
            f"Release {rel.release_id}: the stored spec differs from the one in the signed plan "
            "(edited after planning). Re-plan from the spec."
        )
    return digest


def _signed_key_ids(store: Store, release_id: str) -> set[str]:
    """Key ids recorded in the (hash-chained) trail when this release was approved."""
    return {
        e["payload"].get("key_id")
        for e in trail.entries(store)
        if e["action"] == "release.approve" and e["payload"].get("release_id") == release_id
    }


def verified_approval(store: Store, rel: Release) -> dict:
    """The approval of this exact plan by a steward whose key is the one recorded when approving,
    with a valid signature; refuses anything else."""
    digest = check_plan_intact(rel)
    recorded = _signed_key_ids(store, rel.release_id)
    swapped = False
    for a in reversed(approvals(store, rel.release_id)):
        if not a["decision"].startswith("approve"):
            continue
        ident = keys.check_against_trail(store, keys.get_identity(store, a["approver"]))
        ack = a["decision"] == "approve-ack-non-dp"
        msg = approval_message(rel.release_id, digest, "approve", ack, ident.key_id)
        if ident.key_id not in recorded:
            swapped = True
            continue
        if (
            ident.role == "steward"
            and a["plan_digest"] == digest
            and keys.verify_signature(ident.public_key, msg, bytes.fromhex(a["signature"]))
        ):
            return {**a, "acknowledge_non_dp": ack, "key_id": ident.key_id}
    if swapped:
        raise TamperError(
            f"Release {rel.release_id}: the approving steward's public key is not the key that "
            "signed the approval (the key was replaced after approval). Re-approve with the "
            "steward's current key, or restore the key."
        )
    raise TamperError(
        f"Release {rel.release_id} has no valid steward approval of its current plan. Approve it "
        "with `privrelease release approve`."
    )


def _spec_file_check(spec_file: str | None, signed: dict) -> None:
    """The spec file the plan came from, if it still exists, must still say what was signed."""
    if not spec_file or not Path(spec_file).exists():
        return
    try:
        now = ReleaseSpec.from_toml(Path(spec_file)).as_dict()
    except InvalidParameterError as exc:
        raise TamperError(
            f"The spec file {spec_file} was changed after the plan was made and no longer parses "
            f"({exc}). Re-plan with `privrelease release plan`."
        ) from exc
    if now != signed:
        changed = sorted(
            f"[{t}] {k}"
            for t in set(now) | set(signed)
            for k in set(now.get(t, {})) | set(signed.get(t, {}))
            if now.get(t, {}).get(k) != signed.get(t, {}).get(k)
        )
        raise TamperError(
            f"The spec file {spec_file} was edited after the plan was made ({', '.join(changed)} "
            "changed): what runs must be what was approved. Plan the edited spec as a new release "
            "with `privrelease release plan`, or restore the file."
        )


def bound_inputs(
    store: Store, rel: Release
) -> tuple[Plan, ReleaseSpec, ledger.Dataset, Data, Data | None]:
    """Everything the run reads, each checked against the signed plan before any sensitive data is
    used."""
    plan = rel.plan
    _spec_file_check(plan.spec_file, plan.spec)
    spec = ReleaseSpec.from_dict(plan.spec)
    ds, data = load_registered(store, spec.dataset)
    if (ds.dataset_id, ds.fingerprint) != (plan.dataset_id, plan.dataset_fingerprint):
        raise TamperError(
            f"Release {plan.release_id} was approved for dataset {plan.dataset_id} with another "
            "content fingerprint than the registered one. Re-plan."
        )
    public = load_public(plan.public_source, ds.source)
    if public_sha256(public) != plan.public_sha256:
        raise TamperError(
            f"The public data {plan.public_source} changed since release {plan.release_id} was "
            "approved. Restore it, or re-plan and re-approve."
        )
    return plan, spec, ds, data, public
