"""The release lifecycle: spec -> plan -> approved (steward signature) -> running -> checked ->
published | failed | rejected. Every transition is one store transaction with an audit-trail entry,
and this module holds the transitions only: what a plan shows is release.planning, the signed plan's
checks release.approval, the run's charge release.runner (the only budget owner: README, "Privacy
guarantees and their limits"), the saved output release.artifacts, the audit's inputs
release.audit_inputs, the bundle release.publish."""

from __future__ import annotations

import json
import uuid
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from accounting import ledger, trail
from accounting.errors import (
    BudgetExceededError,
    LedgerStateError,
    PermissionDeniedError,
    PrivReleaseError,
    TamperError,
)
from accounting.store import Store
from release import approval, attempts, keys, planning, runner
from release.artifacts import release_dir, run_and_save
from release.audit_inputs import run_checks
from release.executor import IN_PROCESS, ExecutorChoice
from release.nodes_run import follow_release as follow_release  # `release run --nnodes`, a follower
from release.nodes_run import refuse_unless_coordinator
from release.publish import write_release_bundle
from release.records import Release, get_release, recorded_release, refuse_unless_recorded
from release.records import approvals as approvals  # the releases' reads, as callers know them
from release.records import list_releases as list_releases
from release.spec import Plan, ReleaseSpec
from synth import registry
from synth.progress import ProgressFn, no_progress
from synth.registry import Data, Mechanism
from synth.tools import nodes as multi_host

RUNNABLE = ("approved", "failed", "running")  # a failed or interrupted release resumes


def _steward(store: Store, name: str) -> keys.Identity:
    # the private key, not only the name (README, Trust model)
    return keys.authenticate(store, name, "steward")


def _set_state(
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
    con=None,
) -> None:
    """Move the release from one of the `expected` states to `new`, with its trail entry, in `con`'s
    transaction (a transaction of its own without one)."""
    with store.transaction() if con is None else nullcontext(con) as con:
        row = con.execute(
            "SELECT state FROM releases WHERE release_id = ?", [release_id]
        ).fetchone()
        if row is None:
            raise PrivReleaseError(f"Unknown release {release_id!r}.")
        refuse_unless_recorded(con, release_id)
        if row[0] not in expected:
            raise LedgerStateError(
                f"Release {release_id} is {row[0]}; this needs it to be {' or '.join(expected)}."
            )
        sets = ["state = ?", "updated_at = ?"]
        params: list[str | None] = [new, trail.now()]
        if reason is not None:  # "": cleared (a failure's reason is stale once it runs again)
            sets.append("reason = ?")
            params.append(reason or None)
        if result is not None:
            sets.append("result = ?")
            params.append(json.dumps(result, sort_keys=True))
        con.execute(
            f"UPDATE releases SET {', '.join(sets)} WHERE release_id = ?", params + [release_id]
        )
        trail.append(con, store, actor, action, {"release_id": release_id, "state": new, **payload})


def create_plan(
    store: Store, spec: ReleaseSpec, actor: str, progress: ProgressFn = no_progress
) -> Release:
    """Store a plan: the events it will charge, epsilon before/after (RDP and PLD), warnings. The
    whole spec, policy and data compatibility are validated here, before anything is charged."""
    budget = ledger.budget(store, spec.dataset)
    ds = budget.dataset
    public = planning.plan_public(spec, ds, progress)
    shown = planning.previewed(spec, budget, public, progress)
    if shown.refusal:  # a steward could approve it, but no run of it would ever be admitted
        raise BudgetExceededError(f"Nothing was planned or stored. {shown.refusal}")
    release_id = "rel-" + uuid.uuid4().hex[:10]
    plan = planning.plan_record(release_id, spec, budget, public, shown)
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
    rel = recorded_release(store, release_id)
    current = approval.check_plan_intact(rel)
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
    sig = approval.sign_approval(store, ident, release_id, current, acknowledge_non_dp)
    with store.transaction() as con:
        action = "approve-ack-non-dp" if acknowledge_non_dp else "approve"
        approval.record_decision(con, release_id, ident.name, action, current, sig, None)
        _set_state(
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
            con=con,
        )
    return get_release(store, release_id)


def reject(store: Store, release_id: str, steward: str, reason: str) -> Release:
    ident = _steward(store, steward)
    if not reason.strip():
        raise PrivReleaseError("Give a reason for the rejection (it goes into the audit trail).")
    rel = recorded_release(store, release_id)
    digest = rel.plan_digest
    sig = approval.sign_rejection(store, ident, release_id, digest)
    with store.transaction() as con:
        approval.record_decision(con, release_id, ident.name, "reject", digest, sig, reason)
        _set_state(
            store,
            release_id,
            ("planned", "approved"),
            "rejected",
            ident.name,
            "release.reject",
            {"reason": reason},
            reason=reason,
            con=con,
        )
    return get_release(store, release_id)


def run_release(
    store: Store,
    release_id: str,
    actor: str,
    progress: ProgressFn = no_progress,
    nproc: int = 1,
    executor: ExecutorChoice = IN_PROCESS,
    nodes: multi_host.Nodes | None = None,
) -> Release:
    """Execute an approved plan through the runner (lease -> reserve -> run -> commit), then audit
    it. A failed release can be run again: it resumes under the same charge (no double charge).
    With `nodes` (`--nnodes`) this host is the coordinator and the other hosts run
    `follow_release`."""
    refuse_unless_coordinator(release_id, nodes)
    ident = _steward(store, actor)
    rel = recorded_release(store, release_id)
    if rel.state not in RUNNABLE:
        raise LedgerStateError(
            f"Release {release_id} is {rel.state}; only an approved (or failed) release runs."
        )
    approved = approval.verified_approval(store, rel)
    if rel.result is not None:  # synthesised and settled; only the audit was interrupted: audit it
        return audit_release(store, release_id, ident.name, progress, executor=executor)
    plan, spec, ds, data, public = approval.bound_inputs(store, rel)
    mech = registry.get(plan.mechanism)
    config = planning.mechanism_config(spec, ds)
    _synthesise(
        store,
        rel,
        ident.name,
        (plan, ds, data, public, mech, config),
        approved["acknowledge_non_dp"],
        progress,
        nproc,
        executor,
        nodes,
    )
    try:
        return audit_release(  # it starts its own workers (the run's stopped with its lease)
            store, release_id, ident.name, progress, data=data, public=public, executor=executor
        )
    except BaseException as exc:  # synthesised and settled: a re-run audits it again
        _fail(store, release_id, ident.name, f"audit not finished: {runner.why(exc)}")
        raise


def _synthesise(
    store: Store,
    rel: Release,
    actor: str,
    inputs: tuple[Plan, ledger.Dataset, Data, Data | None, Mechanism, Any],
    acknowledge_non_dp: bool,
    progress: ProgressFn,
    nproc: int,
    executor: ExecutorChoice,
    nodes: multi_host.Nodes | None,
) -> None:
    """Under the run's lease: running -> run through the runner -> synthesised (or failed)."""
    release_id = rel.release_id
    lease = runner.acquire_lease(store, release_id, actor)
    try:
        _set_state(store, release_id, RUNNABLE, "running", actor, "release.run", {}, reason="")
        try:
            summary = run_and_save(
                store,
                rel,
                inputs,
                lease,
                actor=actor,
                acknowledge_non_dp=acknowledge_non_dp,
                progress=progress,
                nproc=nproc,
                executor=executor,
                nodes=nodes,
            )
        except BaseException as exc:
            _fail(store, release_id, actor, runner.why(exc))
            raise
        _set_state(
            store,
            release_id,
            ("running",),
            "running",
            actor,
            "release.synthesised",
            {"count": summary.count, "guarantee": summary.guarantee},
            result=summary.to_json(),
        )
    finally:
        lease.release()


def _fail(store: Store, release_id: str, actor: str, reason: str) -> None:
    _set_state(
        store,
        release_id,
        ("running",),
        "failed",
        actor,
        "release.fail",
        attempts.fail_payload(store, release_id, reason),  # with where its items stood
        reason=reason,
    )


def abandon_release(store: Store, release_id: str, actor: str) -> Release:
    """Settle a failed release that will not be resumed: refunded if it never read sensitive data,
    else the DP-SGD steps it started (write-ahead counter) and every re-charge stay charged and the
    unexecuted remainder is released. It can no longer be resumed. A release left `running` by a
    run that died (killed, power lost: its lease's holder is gone) is settled the same way; one
    whose run is alive is refused."""
    ident = _steward(store, actor)
    rel = recorded_release(store, release_id)
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
        _set_state(
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
    executor: ExecutorChoice = IN_PROCESS,
) -> Release:
    """Run every check on a synthesised release and store the (internal) report; the per-item
    work runs where `executor` says (Dask workers started for the audit, as after a resume)."""
    ident = keys.authenticate(store, actor, "steward", "auditor")
    rel = recorded_release(store, release_id)
    report = run_checks(store, rel, progress, data=data, public=public, executor=executor)
    _set_state(
        store,
        release_id,
        ("running", "checked", "failed"),
        "checked",
        ident.name,
        "release.audit",
        {"passed": report.passed, "verdicts": report.verdicts()},
        reason="",
    )
    return get_release(store, release_id)


def publish(store: Store, release_id: str, actor: str) -> Release:
    """Build the signed bundle; refuses unless every thresholded audit check passed."""
    ident = _steward(store, actor)
    rel = recorded_release(store, release_id)
    if rel.state != "checked":
        raise LedgerStateError(
            f"Release {release_id} is {rel.state}; only a checked release can be published."
        )
    approval.verified_approval(store, rel)
    bundle, res = write_release_bundle(store, rel)
    _set_state(
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
