"""The release lifecycle: spec -> plan -> approved (steward signature) -> running -> checked ->
published | failed | rejected. Every transition is one store transaction with an audit-trail entry.
The budget is charged by release/runner.py only (README, "Privacy guarantees and their limits")."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accounting import calibration, curve, ledger, replay, trail
from accounting import filter as privacy_filter
from accounting.epsilon import epsilon_report
from accounting.errors import (
    BudgetExceededError,
    InvalidParameterError,
    LedgerStateError,
    PermissionDeniedError,
    PrivReleaseError,
    TamperError,
)
from accounting.events import event_to_json
from accounting.integrity import verify_store
from accounting.store import Store
from release import keys, runner
from release.data import data_kind, load_registered
from release.executor import IN_PROCESS, ExecutorChoice
from release.held_out import check_held_out
from release.predicate import Approval, LedgerPosition, ReleasePredicate
from release.records import Release, RunRecord
from release.spec import Plan, ReleaseSpec, canonical
from synth import registry
from synth.kinds.datasets import ImageDataset, heldout_source, load_public, load_source
from synth.kinds.volume import VolumeDataset
from synth.progress import ProgressFn, no_progress
from synth.registry import Data, DatasetInfo, MechanismOutput, MechanismPlan

if TYPE_CHECKING:
    from audit.baseline import Baseline
    from audit.dpsgd_audit import DpSgdSetting
    from release.kanon_estimate import MembershipEstimate

TOOL = "privrelease"
EXTRA_IMAGE = "extra_image__"  # release.npz key prefix of MechanismOutput.extra_images


def _approval_message(
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


def get_release(store: Store, release_id: str) -> Release:
    rows = store.query("SELECT * FROM releases WHERE release_id = ?", [release_id])
    if not rows:
        raise PrivReleaseError(f"Unknown release {release_id!r}. See `privrelease release list`.")
    return Release.from_row(rows[0])


def list_releases(store: Store, viewer: keys.Identity | None = None) -> list[Release]:
    """All releases, newest first; a consumer sees only published ones."""
    rows = [
        Release.from_row(r) for r in store.query("SELECT * FROM releases ORDER BY created_at DESC")
    ]
    if viewer is not None and viewer.role == "consumer":
        rows = [r for r in rows if r.state == "published"]
    return rows


def approvals(store: Store, release_id: str) -> list[dict]:
    return store.query(
        "SELECT * FROM approvals WHERE release_id = ? ORDER BY decided_at", [release_id]
    )


def _steward(store: Store, name: str) -> keys.Identity:
    # the private key, not only the name (README, Trust model)
    return keys.authenticate(store, name, "steward")


def _set_state(
    con,
    store: Store,
    release_id: str,
    expected: tuple[str, ...],
    new: str,
    actor: str,
    action: str,
    payload: dict,
    *,
    reason: str | None = None,
    result: dict | None = None,
) -> None:
    row = con.execute("SELECT state FROM releases WHERE release_id = ?", [release_id]).fetchone()
    if row is None:
        raise PrivReleaseError(f"Unknown release {release_id!r}.")
    _refuse_unless_recorded(con, release_id)
    if row[0] not in expected:
        raise LedgerStateError(
            f"Release {release_id} is {row[0]}; this needs it to be {' or '.join(expected)}."
        )
    sets, params = ["state = ?", "updated_at = ?"], [new, trail.now()]
    if reason is not None:
        sets.append("reason = ?")
        params.append(reason)
    if result is not None:
        sets.append("result = ?")
        params.append(json.dumps(result, sort_keys=True))
    con.execute(
        f"UPDATE releases SET {', '.join(sets)} WHERE release_id = ?", params + [release_id]
    )
    trail.append(con, store, actor, action, {"release_id": release_id, "state": new, **payload})


def _refuse_unless_recorded(con, release_id: str) -> None:
    """The release's row (state, plan digest, dataset) must be what the audit trail recorded: a
    state set back behind privrelease's back (rejected -> approved) must not let it run."""
    problems = replay.release_problems(con, release_id)
    if problems:
        raise TamperError(
            f"Release {release_id} in the store is not what the audit trail recorded ("
            + "; ".join(problems[:2])
            + "): nothing was done. Run `privrelease audit verify`; restore the store from a "
            "backup or a signed checkpoint."
        )


def _recorded_release(store: Store, release_id: str) -> Release:
    """The release, checked against the audit trail (every action that changes it starts here)."""
    rel = get_release(store, release_id)
    with store.transaction() as con:
        _refuse_unless_recorded(con, release_id)
    return rel


def public_sha256(public: ImageDataset | VolumeDataset) -> str:
    """Content hash of PUBLIC data (a plain hash is fine here: nothing sensitive)."""
    if isinstance(public, VolumeDataset):
        return public.content_sha256()
    h = hashlib.sha256()
    for arr in (np.ascontiguousarray(public.images), np.ascontiguousarray(public.labels)):
        h.update(str((arr.dtype.str, arr.shape)).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def dataset_info(ds: ledger.Dataset) -> DatasetInfo:
    return DatasetInfo(
        ds.dataset_id,
        ds.name,
        ds.record_count,
        tuple(ds.labels),
        tuple(ds.image_shape),
        ds.delta_cap,
        data_kind(ds),
    )


def mechanism_config(spec: ReleaseSpec, ds: ledger.Dataset) -> Any:
    mech = registry.get(spec.mechanism)
    return mech.make_config(spec.config_overrides(), dataset_info(ds), spec.n_images, spec.preset)


def _check_policy(spec: ReleaseSpec) -> None:
    from audit import AuditPolicy

    AuditPolicy.from_dict(spec.policy)  # raises InvalidParameterError naming the bad value


# ------------------------------------------------------------------ budget views (CLI and
# dashboard) ------------------------------------------------------------------ plan
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


def _stage(progress: ProgressFn, name: str):
    """progress for one stage of planning, labelled "plan: NAME"."""
    return lambda done, total: progress(f"plan: {name}", done, total)


def _preview(
    spec: ReleaseSpec,
    budget: ledger.Budget,
    public: Data,
    progress: ProgressFn = no_progress,
):
    """Validate everything a run will use and ask the mechanism for its plan (no sensitive data
    read). `progress` sees each stage, the noise calibration's accountant evaluations included."""
    _check_policy(spec)
    ds = budget.dataset
    with calibration.reporting(lambda stage, done, total: progress(f"plan: {stage}", done, total)):
        mplan = _mechanism_plan(spec, budget, public)
    from audit import AuditPolicy

    audited = AuditPolicy.from_dict(spec.policy).face_recognisers
    check_held_out(spec.mechanism, mplan.detail, audited)  # before anything is stored
    accounting_stage = _stage(progress, "epsilon before and after (RDP, PLD)")
    accounting_stage(0, 2)
    before = epsilon_report(budget.history, ds.delta_cap)
    accounting_stage(1, 2)
    after = epsilon_report(budget.history + list(mplan.events), ds.delta_cap)
    accounting_stage(2, 2)
    warnings = list(mplan.warnings)
    if mplan.guarantee_kind == "k-anonymity":
        warnings += _kanon_audit_warning(spec, ds, mplan, public, progress)
    if budget.dp_void:
        warnings.append(
            "A release without a DP guarantee (k-anonymity, de-identification) was already made "
            "from this dataset: its DP guarantees no longer hold."
        )
    rdp_after = curve.curve_of(
        budget.history + list(mplan.events)
    ).rdp  # the cap is a privacy filter on this curve
    refusal = None
    if mplan.guarantee_kind == "dp" and not _admitted(rdp_after, ds):
        refusal = (
            "The cap's privacy filter would stop this release (filter epsilon after it "
            f"{privacy_filter.filter_epsilon(rdp_after, ds.delta_cap):.3f} > cap "
            f"{ds.epsilon_cap:g}; RDP epsilon {after.epsilon_rdp:.3f}): its plan will be refused "
            "and no run of it admitted. "
            + _fitting_target_hint(
                spec, budget, public, progress=_stage(progress, "largest target that fits")
            )
        )
    return mplan, before, after, warnings, refusal


_KANON_ESTIMATES: dict[
    tuple, MembershipEstimate | None
] = {}  # public data only: the same question gets the same answer


def _kanon_audit_warning(
    spec: ReleaseSpec,
    ds: ledger.Dataset,
    mplan: MechanismPlan,
    public: Data,
    progress: ProgressFn,
) -> list[str]:
    """Whether the audit's cluster-membership attack will likely refuse a k-anonymous release,
    re-enacted on the public data (release.kanon_estimate): reads nothing sensitive, so the warning
    may be shown as it is."""
    from audit import AuditPolicy
    from release.kanon_estimate import estimate_membership

    k, threshold = (
        int(mplan.parameters["k"]),
        AuditPolicy.from_dict(spec.policy).kanon_max_attack_precision,
    )
    key = (public_sha256(public), ds.record_count, k, tuple(mplan.output_shape), threshold)
    if key not in _KANON_ESTIMATES:
        _KANON_ESTIMATES[key] = estimate_membership(
            registry.images_only(public, "The k-anonymity estimate"),
            ds.record_count,
            k,
            tuple(mplan.output_shape),
            threshold,
            progress=lambda stage, done, total: progress(f"plan: {stage}", done, total),
        )
    estimate = _KANON_ESTIMATES[key]
    warning = estimate.warning() if estimate is not None else None
    return [warning] if warning else []


def _mechanism_plan(
    spec: ReleaseSpec, budget: ledger.Budget, public: ImageDataset | VolumeDataset
) -> MechanismPlan:
    info = dataset_info(budget.dataset)
    registry.check_data_kind(spec.mechanism, info)  # e.g. PrivImage on head volumes
    return registry.get(spec.mechanism).plan(
        mechanism_config(spec, budget.dataset), info, budget.history, public
    )


def _admitted(rdp: np.ndarray, ds: ledger.Dataset) -> bool:
    """The ledger's own stop rule for the dataset's cap, on a running RDP curve."""
    return privacy_filter.admits(rdp, ds.epsilon_cap, ds.delta_cap)


def _admitted_at(spec: ReleaseSpec, budget: ledger.Budget, public: Data, epsilon: float) -> bool:
    """Whether the cap's filter admits the history plus this spec's plan at target `epsilon` (no
    data read)."""
    try:
        events = _mechanism_plan(
            replace(spec, mechanism_params={**spec.mechanism_params, "epsilon": epsilon}),
            budget,
            public,
        ).events
    except (InvalidParameterError, BudgetExceededError):  # a target too small to calibrate, or
        return False  # at or below what the dataset has already spent
    return _admitted(curve.curve_of(budget.history + list(events)).rdp, budget.dataset)


def _fitting_target_hint(
    spec: ReleaseSpec,
    budget: ledger.Budget,
    public: Data,
    rounds: int = 8,
    progress=lambda done, total: None,
) -> str:
    """The largest target epsilon whose plan the cap's filter admits, by bisection over plans
    between the history's spend and the target (`rounds` of them, rounded down to 2 decimals).
    Bisection, because the filter's epsilon is monotone in the target but not smooth: a plan's
    structure can change with it."""
    target = getattr(mechanism_config(spec, budget.dataset), "epsilon", None)
    if target is None:
        return ""
    # a target at or below what the history has spent fits nothing: search above it
    spent = float(budget.spent_rdp) if budget.history else 0.0
    fits, refused, found = spent, float(target), False
    progress(0, rounds)
    for i in range(rounds):
        guess = (fits + refused) / 2
        with calibration.reporting(no_progress):  # one bar for the whole search, not one per plan
            admitted = _admitted_at(spec, budget, public, guess)
        fits, refused = (guess, refused) if admitted else (fits, guess)
        found = found or admitted
        progress(i + 1, rounds)
    if not found:
        return "No positive target epsilon fits what is left of the cap."
    suggestion = np.floor(fits * 100) / 100
    if suggestion <= spent:  # rounding down would fall to what is already spent
        suggestion = fits
    return (
        f"The largest target that fits is about epsilon = {suggestion:g} (set `epsilon = "
        f"{suggestion:g}` in the spec's [{spec.mechanism}] table), or raise the dataset's cap."
    )


def _public(spec: ReleaseSpec, ds: ledger.Dataset, progress: ProgressFn) -> Data:
    stage = _stage(progress, "public data and mechanism")
    stage(0, 1)
    public = load_public(spec.public_source, ds.source)
    registry.get(spec.mechanism)  # imports the mechanism (torch): seconds on a slow machine
    stage(1, 1)
    return public


def preview(store: Store, spec: ReleaseSpec, progress: ProgressFn = no_progress) -> dict[str, Any]:
    """What planning `spec` would show (events, epsilon before/after, warnings); stores nothing,
    reads no sensitive data, charges nothing."""
    budget = ledger.budget(store, spec.dataset)
    mplan, before, after, warnings, refusal = _preview(
        spec, budget, _public(spec, budget.dataset, progress), progress
    )
    warnings += [refusal] if refusal else []  # a what-if: said, not refused
    return {
        "events_described": [e.describe() for e in mplan.events],
        "epsilon_before": before.as_dict(),
        "epsilon_after": after.as_dict(),
        "expected_count": int(mplan.expected_count),
        "warnings": warnings,
        "requires_acknowledgement": mplan.requires_acknowledgement,
        "choices": list(mplan.detail.get("choices", ())),
    }


def dpsgd_setting(
    store: Store, spec: ReleaseSpec, name: str = ""
) -> tuple[DpSgdSetting, ImageDataset]:
    """The DP-SGD run `spec` would execute now (the plan's q, sigma, steps; the config's clipping,
    learning rate and EMA) and the public data it names: what the one-run implementation audit
    trains. Stores nothing, reads no sensitive data, charges nothing. `name` labels the setting (the
    spec file's path).

    Raises:
        InvalidParameterError: the spec's mechanism runs no DP-SGD.
    """
    from audit.dpsgd_audit import DpSgdSetting

    budget = ledger.budget(store, spec.dataset)
    public = load_public(spec.public_source, budget.dataset.source)
    cfg = mechanism_config(spec, budget.dataset)
    event = _mechanism_plan(spec, budget, public).step_event
    if event is None:
        raise InvalidParameterError(
            f"{name or 'the spec'}: mechanism {spec.mechanism!r} runs no DP-SGD, so there is no "
            "implementation to audit; give a PrivImage spec."
        )
    return DpSgdSetting(
        event.sample_rate,
        event.noise_multiplier,
        event.steps,
        cfg.max_grad_norm,
        cfg.delta,
        cfg.lr,
        cfg.ema_decay,
        f"{Path(name).name}: {event.describe()}" if name else event.describe(),
        getattr(cfg, "dp_optimizer", "adam"),
        getattr(cfg, "noise_multiplicity", 1),
        spec.mechanism,
    ), registry.images_only(public, "The implementation audit")


def create_plan(
    store: Store, spec: ReleaseSpec, actor: str, progress: ProgressFn = no_progress
) -> Release:
    """Store a plan: the events it will charge, epsilon before/after (RDP and PLD), warnings. The
    whole spec, policy and data compatibility are validated here, before anything is charged."""
    budget = ledger.budget(store, spec.dataset)
    ds = budget.dataset
    public = _public(spec, ds, progress)
    mplan, before, after, warnings, refusal = _preview(spec, budget, public, progress)
    if refusal:  # a steward could approve it, but no run of it would ever be admitted
        raise BudgetExceededError(f"Nothing was planned or stored. {refusal}")
    release_id = "rel-" + uuid.uuid4().hex[:10]
    plan = Plan(
        release_id=release_id,
        dataset_id=ds.dataset_id,
        dataset=ds.name,
        dataset_fingerprint=ds.fingerprint,
        mechanism=spec.mechanism,
        spec=spec.as_dict(),
        spec_file=spec.source_file,
        events=[event_to_json(e) for e in mplan.events],
        events_described=[e.describe() for e in mplan.events],
        epsilon_before=before.as_dict(),
        epsilon_after=after.as_dict(),
        epsilon_cap=ds.epsilon_cap,
        remaining_after_rdp=(ds.epsilon_cap - after.epsilon_rdp) if after.finite else None,
        expected_count=int(mplan.expected_count),
        output_shape=list(mplan.output_shape),
        warnings=warnings,
        requires_acknowledgement=mplan.requires_acknowledgement,
        guarantee_kind=mplan.guarantee_kind,
        config=json.loads(json.dumps(dict(mplan.parameters))),
        mechanism_plan=json.loads(json.dumps(dict(mplan.detail))),
        public_source=spec.public_source,
        public_sha256=public_sha256(public),
        ledger_position=len(budget.charges),
    )
    digest, now = plan.digest, trail.now()
    with store.transaction() as con:
        con.execute(
            "INSERT INTO releases VALUES (?, ?, ?, 'planned', ?, ?, ?, ?, ?, ?, NULL, NULL)",
            [
                release_id,
                ds.dataset_id,
                spec.mechanism,
                json.dumps(spec.as_dict(), sort_keys=True),
                json.dumps(plan.to_json(), sort_keys=True),
                digest,
                actor,
                now,
                now,
            ],
        )
        trail.append(
            con,
            store,
            actor,
            "release.plan",
            {
                "release_id": release_id,
                "plan_digest": digest,
                "dataset_id": ds.dataset_id,
                "mechanism": spec.mechanism,
            },
        )
    return get_release(store, release_id)


# ------------------------------------------------------------------ approval
def _check_plan_intact(rel: Release) -> str:
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


def approve(
    store: Store,
    release_id: str,
    steward: str,
    *,
    digest: str | None = None,
    acknowledge_non_dp: bool = False,
) -> Release:
    """A steward signs the plan's digest. `digest` (what the steward reviewed) must match the
    plan."""
    ident = _steward(store, steward)
    rel = _recorded_release(store, release_id)
    current = _check_plan_intact(rel)
    if digest is not None and digest != current:
        raise TamperError(
            f"You reviewed plan digest {digest[:16]}… but release {release_id}'s plan is "
            f"{current[:16]}…: a different or edited plan. Review it again before approving."
        )
    if rel.plan.requires_acknowledgement and not acknowledge_non_dp:
        raise PermissionDeniedError(
            f"Release {release_id} is {registry.guarantee_label(rel.plan.guarantee_kind)}: it "
            "carries no DP guarantee, and after it no "
            "release of this dataset keeps one (its epsilon becomes infinite). Approve with "
            "--acknowledge-non-dp to accept this."
        )
    msg = _approval_message(release_id, current, "approve", acknowledge_non_dp, ident.key_id)
    sig = keys.sign(store.workspace, ident.name, msg)
    if not keys.verify_signature(ident.public_key, msg, sig):
        raise TamperError(
            f"{ident.name}'s private key does not match the public key registered for "
            f"{ident.name}; the key files or the store were changed. Nothing was approved."
        )
    with store.transaction() as con:
        con.execute(
            "INSERT INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                release_id,
                ident.name,
                "approve-ack-non-dp" if acknowledge_non_dp else "approve",
                current,
                sig.hex(),
                None,
                trail.now(),
            ],
        )
        _set_state(
            con,
            store,
            release_id,
            ("planned",),
            "approved",
            ident.name,
            "release.approve",
            {
                "plan_digest": current,
                "signature": sig.hex(),
                "key_id": ident.key_id,
                "acknowledge_non_dp": acknowledge_non_dp,
            },
        )
    return get_release(store, release_id)


def reject(store: Store, release_id: str, steward: str, reason: str) -> Release:
    ident = _steward(store, steward)
    if not reason.strip():
        raise PrivReleaseError("Give a reason for the rejection (it goes into the audit trail).")
    rel = _recorded_release(store, release_id)
    digest = rel.plan_digest
    sig = keys.sign(
        store.workspace,
        ident.name,
        _approval_message(release_id, digest, "reject", False, ident.key_id),
    )
    with store.transaction() as con:
        con.execute(
            "INSERT INTO approvals VALUES (?, ?, 'reject', ?, ?, ?, ?)",
            [release_id, ident.name, digest, sig.hex(), reason, trail.now()],
        )
        _set_state(
            con,
            store,
            release_id,
            ("planned", "approved"),
            "rejected",
            ident.name,
            "release.reject",
            {"reason": reason},
            reason=reason,
        )
    return get_release(store, release_id)


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
    digest = _check_plan_intact(rel)
    recorded = _signed_key_ids(store, rel.release_id)
    swapped = False
    for a in reversed(approvals(store, rel.release_id)):
        if not a["decision"].startswith("approve"):
            continue
        ident = keys.check_against_trail(store, keys.get_identity(store, a["approver"]))
        ack = a["decision"] == "approve-ack-non-dp"
        msg = _approval_message(rel.release_id, digest, "approve", ack, ident.key_id)
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


# ------------------------------------------------------------------ run and audit
def release_dir(store: Store, release_id: str) -> Path:
    return store.workspace.artifacts / release_id


def _save_output(
    store: Store, release_id: str, result: runner.RunResult, mechanism: str
) -> RunRecord:
    """One copy of the output: release.npz (images, labels) + internal.json (sensitive-derived,
    internal)."""
    from audit.report import jsonable

    out, o = release_dir(store, release_id), result.output
    out.mkdir(parents=True, exist_ok=True)
    if o.volumes is not None:  # the released NIfTI files, headers stripped (what is published)
        from synth.kinds.nifti import write_volume

        folder = out / VOLUMES_DIR
        folder.mkdir(exist_ok=True)
        for name, volume in zip(
            volume_names(release_id, len(o.volumes)), o.volumes.volumes, strict=True
        ):
            write_volume(volume, folder / name)
    arrays: dict[str, Any] = {"images": o.images, "labels": o.labels}
    if o.label_distributions is not None:
        arrays["label_distributions"] = o.label_distributions
    for name, extra in o.extra_images.items():
        arrays[EXTRA_IMAGE + name] = extra
    np.savez_compressed(out / "release.npz", **arrays)
    internal = {
        **o.internal,
        "clusters": None if o.clusters is None else [c.tolist() for c in o.clusters],
        "selected_public_indices": None
        if o.selected_public_indices is None
        else o.selected_public_indices.tolist(),
        "withheld": {str(i): why for i, why in o.withheld.items()},
    }
    (out / "internal.json").write_text(json.dumps(jsonable(internal)))
    summary = {
        "mechanism": mechanism,
        "guarantee": result.guarantee.as_dict(),
        "parameters": dict(o.parameters),
        "executed_events": [event_to_json(e) for e in result.executed_events],
        "generator": o.generator,
        "artifacts": dict(o.artifacts),
        "count": int(len(o.images)),
        "charge_id": result.charge_id,
    }
    return RunRecord.from_json(jsonable(summary))


def load_release_data(
    store: Store, release_id: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    with np.load(release_dir(store, release_id) / "release.npz") as z:
        return (
            z["images"],
            z["labels"],
            (z["label_distributions"] if "label_distributions" in z else None),
        )


def load_extra_images(store: Store, release_id: str) -> dict[str, np.ndarray]:
    """The release's extra image columns (MechanismOutput.extra_images), by name."""
    with np.load(release_dir(store, release_id) / "release.npz") as z:
        return {k[len(EXTRA_IMAGE) :]: z[k] for k in z.files if k.startswith(EXTRA_IMAGE)}


def load_output(store: Store, release_id: str) -> MechanismOutput:
    """A synthesised release's output, typed (internal fields included: stewards and auditors
    only)."""
    rel = get_release(store, release_id)
    if rel.result is None:
        raise LedgerStateError(f"Release {release_id} has not been synthesised yet; run it first.")
    images, labels, dist = load_release_data(store, release_id)
    path = release_dir(store, release_id) / "internal.json"
    internal = json.loads(path.read_text()) if path.exists() else {}
    clusters, selected = (
        internal.pop("clusters", None),
        internal.pop("selected_public_indices", None),
    )
    withheld = {int(i): str(why) for i, why in (internal.pop("withheld", None) or {}).items()}
    res = rel.result
    folder = release_dir(store, release_id) / VOLUMES_DIR
    volumes = None
    if folder.is_dir():
        from synth.kinds.nifti import read_volume

        volumes = VolumeDataset(
            [read_volume(folder / n, n) for n in volume_names(release_id, len(images))],
            str(folder),
        )
    return MechanismOutput(
        volumes=volumes,
        images=images,
        labels=labels,
        parameters=res.parameters,
        label_distributions=dist,
        clusters=None
        if clusters is None
        else tuple(np.asarray(c, dtype=np.int64) for c in clusters),
        selected_public_indices=None if selected is None else np.asarray(selected, dtype=np.int64),
        internal=internal,
        generator=res.generator,
        artifacts=res.artifacts,
        extra_images=load_extra_images(store, release_id),
        withheld=withheld,
    )


def _bound_inputs(
    store: Store, rel: Release
) -> tuple[Plan, ReleaseSpec, ledger.Dataset, Data, Data]:
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


def run_release(
    store: Store,
    release_id: str,
    actor: str,
    progress: ProgressFn = no_progress,
    nproc: int = 1,
    executor: ExecutorChoice = IN_PROCESS,
) -> Release:
    """Execute an approved plan through the runner (lease -> reserve -> run -> commit), then audit
    it. A failed release can be run again: it resumes under the same charge (no double charge)."""
    ident = _steward(store, actor)
    rel = _recorded_release(store, release_id)
    if rel.state not in ("approved", "failed", "running"):
        raise LedgerStateError(
            f"Release {release_id} is {rel.state}; only an approved (or failed) release runs."
        )
    approval = verified_approval(store, rel)
    if rel.result is not None:  # synthesised and settled; only the audit was interrupted: audit it
        return audit_release(store, release_id, ident.name, progress)
    plan, spec, ds, data, public = _bound_inputs(store, rel)
    mech = registry.get(plan.mechanism)
    config = mechanism_config(spec, ds)
    lease = runner.acquire_lease(store, release_id, ident.name)
    try:
        with store.transaction() as con:
            _set_state(
                con,
                store,
                release_id,
                ("approved", "failed", "running"),
                "running",
                ident.name,
                "release.run",
                {},
            )
        try:
            result = runner.run_charged(
                store,
                run_id=release_id,
                dataset=ds.name,
                data=data,
                public=public,
                mechanism=mech,
                config=config,
                plan=plan.mechanism_view(),
                workdir=release_dir(store, release_id) / "work",
                progress=progress,
                actor=ident.name,
                acknowledge_non_dp=approval["acknowledge_non_dp"],
                lease=lease,
                nproc=nproc,
                executor=executor,
            )
            summary = _save_output(store, release_id, result, plan.mechanism)
        except BaseException as exc:
            _fail(store, release_id, ident.name, runner.why(exc))
            raise
        with store.transaction() as con:
            _set_state(
                con,
                store,
                release_id,
                ("running",),
                "running",
                ident.name,
                "release.synthesised",
                {"count": summary.count, "guarantee": summary.guarantee},
                result=summary.to_json(),
            )
    finally:
        lease.release()
    try:
        return audit_release(store, release_id, ident.name, progress, data=data, public=public)
    except BaseException as exc:  # synthesised and settled: a re-run audits it again
        _fail(store, release_id, ident.name, f"audit not finished: {runner.why(exc)}")
        raise


def _fail(store: Store, release_id: str, actor: str, reason: str) -> None:
    with store.transaction() as con:
        _set_state(
            con,
            store,
            release_id,
            ("running",),
            "failed",
            actor,
            "release.fail",
            {"reason": reason},
            reason=reason,
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


def abandon_release(store: Store, release_id: str, actor: str) -> Release:
    """Settle a failed release that will not be resumed: refunded if it never read sensitive data,
    else the DP-SGD steps it started (write-ahead counter) and every re-charge stay charged and the
    unexecuted remainder is released. It can no longer be resumed. A release left `running` by a
    run that died (killed, power lost: its lease's holder is gone) is settled the same way; one
    whose run is alive is refused."""
    ident = _steward(store, actor)
    rel = _recorded_release(store, release_id)
    if rel.state not in ("failed", "running"):
        raise LedgerStateError(
            f"Release {release_id} is {rel.state}; only a failed release (or one whose run died) "
            "can be abandoned."
        )
    plan = rel.plan
    ds = ledger.get_dataset(store, plan.dataset_id)
    # held until the state is recorded: no new `release run` can start in between
    lease = runner.acquire_lease(store, release_id, ident.name)
    try:
        charge = runner.abandon(
            store,
            run_id=release_id,
            dataset=ds.name,
            plan=plan.mechanism_view(),
            workdir=release_dir(store, release_id) / "work",
            actor=ident.name,
            lease=lease,
        )
        state = charge.state if charge else "none"
        with store.transaction() as con:
            _set_state(
                con,
                store,
                release_id,
                ("failed", "running"),
                "failed",
                ident.name,
                "release.abandon",
                {"charge_state": state},
                reason=f"abandoned by {ident.name} (charge {state})",
            )
    finally:
        lease.release()
    return get_release(store, release_id)


def audit_release(
    store: Store,
    release_id: str,
    actor: str,
    progress: ProgressFn = no_progress,
    *,
    data: Data | None = None,
    public: Data | None = None,
) -> Release:
    """Run every check on a synthesised release and store the (internal) report."""
    from audit import AuditInputs, AuditPolicy, run_audit, save_report
    from audit.dpsgd_audit import DpSgdSetting

    ident = keys.authenticate(store, actor, "steward", "auditor")
    rel = _recorded_release(store, release_id)
    out = load_output(store, release_id)
    spec = ReleaseSpec.from_dict(rel.spec)
    ds, sensitive = (
        (ledger.get_dataset(store, spec.dataset), data)
        if data is not None
        else load_registered(store, spec.dataset)
    )
    # load_output refused a release not run
    mechanism = rel.result.mechanism if rel.result else rel.mechanism
    g = rel.guarantee
    selected = None
    if out.selected_public_indices is not None:
        pool = registry.images_only(public or load_source(spec.public_source), "The SDS check")
        selected = pool.subset(out.selected_public_indices)
    volume_files = (
        None
        if out.volumes is None
        else [
            release_dir(store, release_id) / VOLUMES_DIR / n
            for n in volume_names(release_id, len(out.volumes))
        ]
    )
    inputs = AuditInputs(
        release_id=release_id,
        images=out.images,
        labels=out.labels,
        ids=release_ids(release_id, len(out.images)),
        # a mechanism may withhold records it cannot process (a photo without a face), and says so
        expected_count=int(rel.plan.expected_count) - len(out.withheld),
        label_set=list(ds.labels),
        sensitive=sensitive,
        heldout=spec_heldout(spec, ds),
        record_fingerprint_key=store.workspace.hmac_key(),
        mechanism=mechanism,
        guarantee_kind=str(g.get("type") or rel.plan.guarantee_kind),
        claimed_epsilon=g.get("epsilon_rdp"),
        delta=g.get("delta"),
        k=g.get("k"),
        loss_fn=registry.get(mechanism).loss_function(out.generator),
        clusters=None if out.clusters is None else list(out.clusters),
        selected_public=selected,
        artifacts_dir=release_dir(store, release_id) / "audit",
        dpsgd=DpSgdSetting.from_plan(
            rel.plan.mechanism_plan or {}, rel.plan.config or {}, spec.mechanism
        ),
        volumes=out.volumes,
        volume_files=volume_files,
        cache_dir=runner.public_cache_dir(store),
        baselines=baselines(store, rel, spec, ds),
        searched_recognisers=out.parameters.get("searched_recognisers"),
    )
    report = run_audit(inputs, AuditPolicy.from_dict(spec.policy), progress)
    save_report(store, report)
    with store.transaction() as con:
        _set_state(
            con,
            store,
            release_id,
            ("running", "checked", "failed"),
            "checked",
            ident.name,
            "release.audit",
            {"passed": report.passed, "verdicts": report.verdicts()},
        )
    return get_release(store, release_id)


def baselines(store: Store, rel: Release, spec: ReleaseSpec, ds: ledger.Dataset) -> list[Baseline]:
    """Earlier DP releases of the same dataset by another mechanism (a DP-MERF release is the
    usual one), checked or published, whose audit measured downstream accuracy on the same held-out
    source: what a DP release is compared with (audit.baseline)."""
    from audit import load_report
    from audit.baseline import Baseline

    if rel.plan.guarantee_kind != registry.DP:
        return []
    heldout = spec.heldout or heldout_source(ds.source)
    out = []
    for other in list_releases(store):
        if (
            other.release_id == rel.release_id
            or other.state not in ("checked", "published")
            or other.plan.dataset != spec.dataset
            or other.mechanism == rel.mechanism
            or other.plan.guarantee_kind != registry.DP
        ):
            continue
        other_spec = ReleaseSpec.from_dict(other.spec)
        if (other_spec.heldout or heldout_source(ds.source)) != heldout:
            continue
        report = load_report(store, other.release_id)
        utility = next(
            (r for r in (report.results if report else []) if r.name == "downstream_accuracy"),
            None,
        )
        best = utility.details.get("best") if utility is not None else None
        if isinstance(best, (int, float)):
            out.append(Baseline(other.release_id, other.mechanism, float(best)))
    return out


def spec_heldout(spec: ReleaseSpec, ds: ledger.Dataset) -> ImageDataset | None:
    source = spec.heldout or heldout_source(ds.source)
    return load_source(source) if source else None


def release_ids(release_id: str, n: int) -> list[str]:
    return [f"{release_id}-{i:06d}" for i in range(n)]


VOLUMES_DIR = "volumes"  # a volume release's NIfTI files, in artifacts/REL/ and in the bundle


def volume_names(release_id: str, n: int) -> list[str]:
    """The released NIfTI files' names: the row ids (the source file names can identify people
    and are never released)."""
    return [f"{i}.nii.gz" for i in release_ids(release_id, n)]


# ------------------------------------------------------------------ publish
def publish(store: Store, release_id: str, actor: str) -> Release:
    """Build the signed bundle; refuses unless every thresholded audit check passed."""
    from audit import load_report
    from release.bundle import write_bundle
    from release.card import card_for

    ident = _steward(store, actor)
    rel = _recorded_release(store, release_id)
    if rel.state != "checked":
        raise LedgerStateError(
            f"Release {release_id} is {rel.state}; only a checked release can be published."
        )
    verified_approval(store, rel)
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
    volumes = release_dir(store, release_id) / VOLUMES_DIR
    files = None
    if volumes.is_dir():  # a volume release: its NIfTI files, and a column naming each row's file
        files = {
            f"data/{VOLUMES_DIR}/{n}": volumes / n for n in volume_names(release_id, len(images))
        }
        extra["file"] = np.array(list(files))
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
    with store.transaction() as con:
        _set_state(
            con,
            store,
            release_id,
            ("checked",),
            "published",
            ident.name,
            "release.publish",
            bundle,
            result=replace(res, bundle=bundle).to_json(),
        )
    return get_release(store, release_id)


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
        tool={"name": TOOL, "version": _version()},
        history=ledger_history(store, ds.dataset_id),  # whole ledger: consumers recompute epsilon
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("privrelease")
    except PackageNotFoundError:
        return "0+unknown"
