"""The one runner: it alone charges the budget for every mechanism (ARCHITECTURE.md, "Path of a
release").

    lease -> reserve the plan's events -> mechanism.run(config, data, ctx) -> commit what ran |
    refund

One failure rule for every mechanism: a run that fails before `ctx.on_sensitive_access()` is
refunded; after it, the reservation stays in force (counted in full) until the run is resumed or
abandoned, and settling commits what the write-ahead step counter says was started (never fewer
steps), plus every re-charge of steps lost in a crash. A release runs at most once at a time: the
runner holds an exclusive lease row in the store (holder, pid, host, expiry kept alive by a
heartbeat). A lease whose holder died can be taken over; the dead attempt's reservation stays in
force and its lost steps are charged again before they are re-executed.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from accounting import ledger, trail
from accounting.errors import LedgerStateError, PermissionDeniedError, PrivReleaseError
from accounting.events import MechanismEvent
from accounting.store import Store
from release import executor as executors
from release import threads
from release.data import dataset_info
from synth import registry
from synth.progress import ProgressFn, no_progress
from synth.registry import Data, Guarantee, Mechanism, MechanismOutput, MechanismPlan
from synth.tools import step_counter
from synth.tools.nodes import NodePool, Nodes, plan_fingerprint

LEASE_TTL_S = 120.0  # a lease on another host lapses this long after its last heartbeat
HEARTBEAT_S = 15.0
LEASES = """CREATE TABLE IF NOT EXISTS run_leases (
    run_id VARCHAR PRIMARY KEY, token VARCHAR, holder VARCHAR NOT NULL, pid BIGINT NOT NULL,
    host VARCHAR NOT NULL,
    acquired_at VARCHAR NOT NULL, expires_at DOUBLE NOT NULL, charge_id VARCHAR,
    accessed BOOLEAN NOT NULL)"""


class RunInProgressError(LedgerStateError):
    """Another process or thread holds this run's lease."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager's or `kill`'s stop) during a run: handled as a Ctrl-C, so that the
    run settles its charge and leaves the release failed, never `running` with a dead holder."""


@dataclass(frozen=True)
class RunResult:
    output: MechanismOutput
    guarantee: Guarantee
    executed_events: tuple[MechanismEvent, ...]
    charge_id: str

    images = property(lambda self: self.output.images)
    labels = property(lambda self: self.output.labels)
    parameters = property(lambda self: self.output.parameters)
    internal = property(lambda self: self.output.internal)
    artifacts = property(lambda self: self.output.artifacts)


# ------------------------------------------------------------------ the lease
def _rows(con, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _holder_alive(row: dict) -> bool:
    if row["host"] == socket.gethostname():
        if row["pid"] == os.getpid():
            return True  # another thread of this process
        try:
            os.kill(int(row["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return time.time() < row["expires_at"]


class Lease:
    """The exclusive right to execute one run; `release()` gives it back (a crash leaves it to
    lapse)."""

    def __init__(self, store: Store, run_id: str, token: str, row: dict) -> None:
        self.store, self.run_id, self.token, self.row = store, run_id, token, row
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name=f"lease-{run_id}", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.update(expires_at=time.time() + LEASE_TTL_S)
            except Exception:
                pass  # a missed beat only shortens the lease; the run goes on

    def update(self, **values: Any) -> dict:
        with self.store.transaction() as con:
            sets = ", ".join(f"{k} = ?" for k in values)
            n = con.execute(
                f"UPDATE run_leases SET {sets} WHERE run_id = ? AND token = ? RETURNING run_id",
                [*values.values(), self.run_id, self.token],
            ).fetchall()
            if not n:
                raise RunInProgressError(
                    f"Run {self.run_id}: this process lost its lease (taken over as stale); "
                    "stopping. See `privrelease release show`."
                )
            return _rows(con, "SELECT * FROM run_leases WHERE run_id = ?", [self.run_id])[0]

    def release(self) -> None:
        self._stop.set()
        with self.store.transaction() as con:
            con.execute(
                "UPDATE run_leases SET token = NULL WHERE run_id = ? AND token = ?",
                [self.run_id, self.token],
            )


def acquire_lease(store: Store, run_id: str, actor: str) -> Lease:
    """Take the run's lease, or refuse if a live holder has it; a dead holder's lease is taken over
    (recorded in the audit trail)."""
    token = uuid.uuid4().hex
    with store.transaction() as con:
        con.execute(LEASES)
        rows = _rows(con, "SELECT * FROM run_leases WHERE run_id = ?", [run_id])
        old = rows[0] if rows else None
        if old is not None and old["token"] is not None:
            if _holder_alive(old):
                raise RunInProgressError(
                    f"Run {run_id} is already running (by {old['holder']}, pid {old['pid']} on "
                    f"{old['host']}, since {old['acquired_at'][:19]}). Wait for it to finish, then "
                    f"see `privrelease release show {run_id}`. If it hangs, stop it (`kill "
                    f"{old['pid']}` on {old['host']}; another host's lease also lapses "
                    f"{LEASE_TTL_S:.0f} s after its last heartbeat), then resume it with "
                    f"`privrelease release run {run_id}` or settle it with `privrelease release "
                    f"abandon {run_id}`."
                )
            trail.append(
                con,
                store,
                actor,
                "run.lease_takeover",
                {
                    "run_id": run_id,
                    "previous_holder": old["holder"],
                    "previous_pid": old["pid"],
                    "previous_host": old["host"],
                    "charge_id": old["charge_id"],
                    "accessed": bool(old["accessed"]),
                },
            )
        values = [
            token,
            actor,
            os.getpid(),
            socket.gethostname(),
            trail.now(),
            time.time() + LEASE_TTL_S,
        ]
        if old is None:
            con.execute(
                "INSERT INTO run_leases VALUES (?, ?, ?, ?, ?, ?, ?, NULL, FALSE)",
                [run_id, *values],
            )
        else:
            con.execute(
                "UPDATE run_leases SET token = ?, holder = ?, pid = ?, host = ?, acquired_at = ?, "
                "expires_at = ? WHERE run_id = ?",
                [*values, run_id],
            )
        row = _rows(con, "SELECT * FROM run_leases WHERE run_id = ?", [run_id])[0]
    return Lease(store, run_id, token, row)


# ------------------------------------------------------------------ the context a mechanism runs in
def public_cache_dir(store: Store) -> Path:
    """Where mechanisms keep what they computed from PUBLIC data only (pre-trained models), shared
    by every release of the workspace: PRIVRELEASE_CACHE if set, else <workspace>/cache."""
    env = os.environ.get("PRIVRELEASE_CACHE")
    return Path(env) if env else store.workspace.root / "cache"


class _Context:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        dataset: str,
        plan: MechanismPlan,
        workdir: Path,
        progress: ProgressFn,
        public: Data | None,
        actor: str,
        nproc: int = 1,
        executor: executors.InProcess | executors.DaskExecutor | None = None,
        node_pool: NodePool | None = None,
    ) -> None:
        self.store, self.lease, self.dataset, self.plan = store, lease, dataset, plan
        self.workdir, self.progress, self.public, self.actor = workdir, progress, public, actor
        self.cache_dir: Path | None = public_cache_dir(store)
        self.nproc = nproc  # this process stays the only one that charges, whatever the workers do
        # `--nnodes`: the ranks of every host, started (and agreed on the plan) before reserving
        self.node_pool = node_pool
        if node_pool is not None:
            self.nproc = node_pool.nodes.world_size
            self.nproc_per_node = node_pool.nodes.nproc_per_node
        # where per-item work runs (release/executor.py); workers never see the store
        self.map_items = executors.ItemMapper(executor, progress, workdir)
        self.executor = self.map_items.executor

    def prepare_workers(self, setup: Callable[..., Any], *args: Any) -> list[Any]:
        return self.map_items.setup(setup, *args)

    @property
    def charge_id(self) -> str:
        return self.lease.row["charge_id"]

    def on_sensitive_access(self) -> None:
        if not self.lease.row["accessed"]:
            self.lease.row = self.lease.update(accessed=True)
            with self.store.transaction() as con:
                trail.append(
                    con,
                    self.store,
                    self.actor,
                    "run.sensitive_access",
                    {"run_id": self.lease.run_id, "charge_id": self.charge_id},
                )

    def charge_lost_steps(self, started: int, resumed_from: int) -> None:
        step = self.plan.step_event
        redo = _redo_charges(self.store, self.dataset, self.charge_id)
        lost = int(started) - int(resumed_from) - sum(_steps(c.planned_events) for c in redo)
        if step is None or lost <= 0:
            return
        ledger.reserve(
            self.store,
            self.dataset,
            [replace(step, steps=lost)],
            f"{self.charge_id}:redo-{len(redo) + 1}",
            description=(
                f"{self.lease.run_id}: {lost} DP-SGD steps executed but lost in a crash, run again"
            ),
            actor=self.actor,
        )


def _steps(events) -> int:
    return sum(getattr(e, "steps", 0) for e in events)


def _redo_charges(store: Store, dataset: str, charge_id: str) -> list[ledger.Charge]:
    return [
        c
        for c in ledger.budget(store, dataset).charges
        if c.run_id.startswith(f"{charge_id}:redo-")
    ]


# ------------------------------------------------------------------ run, settle, abandon
def _charge_for_attempt(store: Store, lease: Lease, dataset: str) -> str:
    """The charge this attempt runs under: the current one unless it was refunded (then a new
    one)."""
    current = lease.row["charge_id"]
    if current is not None:
        charge = ledger.get_charge(store, current)
        if charge is not None and charge.state == "committed":
            raise LedgerStateError(
                f"Run {lease.run_id} is already settled (charge {current} committed); its results "
                "cannot be recomputed without a new charge. Plan a new release."
            )
        if charge is None or charge.state == "reserved":
            return current
    attempt = re.compile(rf"{re.escape(lease.run_id)}(:attempt-\d+)?")  # not their redo charges
    attempts = [c for c in ledger.budget(store, dataset).charges if attempt.fullmatch(c.run_id)]
    new = lease.run_id if not attempts else f"{lease.run_id}:attempt-{len(attempts) + 1}"
    lease.row = lease.update(charge_id=new, accessed=False)
    return new


def _refuse_placement(
    mech: Mechanism, *, nproc: int, executor: executors.ExecutorChoice, nodes: Nodes | None
) -> None:
    """Refuse --nnodes, --nproc or --workers/--cluster where the mechanism cannot use them."""
    if nodes is not None and (mech.node_worker is None or nproc != 1):
        raise PrivReleaseError(
            f"--nnodes {nodes.nnodes}: "
            + (
                f"mechanism {mech.name!r} trains on one host only; leave out --nnodes (those "
                "that train across hosts: "
                + ", ".join(n for n in registry.names() if registry.get(n).node_worker is not None)
                + ")."
                if mech.node_worker is None
                else "give the processes of each host with --nproc-per-node, not --nproc."
            )
            + " Nothing was charged."
        )
    if nodes is not None and not nodes.coordinator:
        raise PrivReleaseError(
            "Internal error: only the coordinator (node rank 0) runs a release through the runner; "
            "other hosts follow (release.manager.follow_release). Nothing was charged."
        )
    if nproc != 1 and not mech.distributed:
        raise PrivReleaseError(
            f"--nproc {nproc}: mechanism {mech.name!r} runs in one process only; leave out --nproc "
            "(only a distributed mechanism trains on several processes). Nothing was charged."
        )
    if not executor.in_process and mech.per_item is None:
        with_items = [n for n in registry.names() if registry.get(n).per_item is not None]
        raise PrivReleaseError(
            f"--workers / --cluster: mechanism {mech.name!r} has no per-item work to spread over "
            f"workers (those that do: {', '.join(with_items) or 'none'}); leave them out. "
            "Nothing was charged."
        )


def _refuse_unrunnable(
    store: Store,
    mech: Mechanism,
    run_id: str,
    dataset: str,
    data: Data,
    plan: MechanismPlan,
    acknowledge_non_dp: bool,
) -> None:
    """Refuse, before any lease or charge, a run without its acknowledgement or the right data."""
    if plan.requires_acknowledgement and not acknowledge_non_dp:
        raise PermissionDeniedError(
            f"Run {run_id} makes a release without a DP guarantee. "
            f"{plan.warnings[0] if plan.warnings else ''} It needs the steward's explicit "
            "acknowledgement (`release approve --acknowledge-non-dp`)."
        )
    wanted = mech.data_kind
    if registry.data_kind(data) != wanted:
        raise PrivReleaseError(
            f"Mechanism {mech.name!r} works on {wanted}, but run {run_id} was given "
            f"{registry.data_kind(data)}. Nothing was charged."
        )
    if len(data) != ledger.get_dataset(store, dataset).record_count:
        raise PrivReleaseError(
            f"Dataset {dataset!r} is registered with a different number of records than the "
            f"{len(data)} given; pass the registered data."
        )


def _join_nodes(
    nodes: Nodes, mech: Mechanism, run_id: str, fingerprint: str, workdir: Path
) -> NodePool:
    """The pool of every host's ranks for `--nnodes` (started by the caller, before reserving)."""
    assert mech.node_worker is not None  # refused above
    return NodePool(
        nodes,
        worker=mech.node_worker,
        run_id=run_id,
        fingerprint=fingerprint,
        workdir=workdir,
    )


def _reserve_attempt(
    store: Store,
    lease: Lease,
    dataset: str,
    plan: MechanismPlan,
    description: str,
    actor: str,
    acknowledge_non_dp: bool,
) -> str:
    """Reserve the plan's events under this attempt's charge, which it returns."""
    charge_id = _charge_for_attempt(store, lease, dataset)
    ledger.reserve(
        store,
        dataset,
        list(plan.events),
        charge_id,
        actor=actor,
        allow_non_private=acknowledge_non_dp,
        description=description,
    )
    return charge_id


def _rebalancing(progress: ProgressFn, nproc: int, nodes: Nodes | None) -> ProgressFn:
    """In one process, the progress reports that also rebalance the thread budget during a run."""
    if nproc == 1 and nodes is None:  # torchrun's workers choose their own
        # looked at again during the run, from the mechanism's progress reports
        return threads.rebalancing(progress, threads.apply())
    return progress


def _run_or_refund(
    store: Store, mech: Mechanism, config: Any, data: Data, ctx: _Context, charge_id: str
) -> MechanismOutput:
    """Run the mechanism; if it fails before reading sensitive data, refund its charge (rule 2)."""
    try:
        return mech.run(config, data, ctx)
    except BaseException as exc:
        if not ctx.lease.row["accessed"]:  # nothing sensitive was read: refund (rule 2)
            ledger.refund(
                store,
                charge_id,
                reason=f"failed before reading sensitive data: {why(exc)}",
                actor=ctx.actor,
            )
        raise


def _close_run(
    pool: NodePool | None,
    items_on: executors.InProcess | executors.DaskExecutor | None,
    lease: Lease | None,
) -> None:
    """Stop the hosts' ranks, then the item workers, then release an own lease, each surely."""
    try:
        if pool is not None:
            pool.close()
    finally:
        try:
            if items_on is not None:
                items_on.close()
        finally:
            if lease is not None:
                lease.release()


def run_charged(
    store: Store,
    *,
    run_id: str,
    dataset: str,
    data: Data,
    public: Data | None,
    mechanism: str | Mechanism,
    config: Any,
    plan: MechanismPlan,
    workdir: Path,
    progress: ProgressFn = no_progress,
    actor: str = "system",
    acknowledge_non_dp: bool = False,
    lease: Lease | None = None,
    nproc: int = 1,
    executor: executors.ExecutorChoice = executors.IN_PROCESS,
    nodes: Nodes | None = None,
    fingerprint: str | None = None,
) -> RunResult:
    """Run (or resume) `mechanism` on `data` under `run_id`, charged to `dataset`'s ledger. With
    `lease` (the caller's, from `acquire_lease`) the caller keeps and releases it. With `nproc` > 1
    a distributed mechanism trains on that many processes; with `executor` (`--workers N`,
    `--cluster ADDR`) a mechanism that declares a per-item function runs its items on Dask
    workers, started (and stopped) here for `--workers`. With `nodes` (`--nnodes`, this host the
    coordinator) it trains on the ranks of every host, which first agree that they run the plan
    whose `fingerprint` (the approved plan's digest; by default one of `plan`) this host runs.
    This process alone charges the ledger."""
    mech = registry.get(mechanism) if isinstance(mechanism, str) else mechanism
    _refuse_placement(mech, nproc=nproc, executor=executor, nodes=nodes)
    _refuse_unrunnable(store, mech, run_id, dataset, data, plan, acknowledge_non_dp)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    own = lease is None
    lease = acquire_lease(store, run_id, actor) if lease is None else lease
    items_on = None
    pool = None
    try:
        # started before the reservation: a cluster that cannot be reached charges nothing
        items_on = executors.start(executor, workdir)  # its run.log in the work folder
        if nodes is not None:  # every host joins and agrees on the plan, or nothing is charged
            pool = _join_nodes(nodes, mech, run_id, fingerprint or plan_fingerprint(plan), workdir)
            pool.start(progress)
        charge_id = _reserve_attempt(
            store, lease, dataset, plan, f"{mech.name} run {run_id}", actor, acknowledge_non_dp
        )
        progress = _rebalancing(progress, nproc, nodes)
        ctx = _Context(
            store, lease, dataset, plan, workdir, progress, public, actor, nproc, items_on, pool
        )
        output = _run_or_refund(store, mech, config, data, ctx, charge_id)
        executed = _settle(store, dataset, plan, charge_id, workdir, actor)
        return RunResult(output, _guarantee(store, dataset, plan), tuple(executed), charge_id)
    finally:
        _close_run(pool, items_on, lease if own else None)


def why(exc: BaseException) -> str:
    """A failure in words for the store (a Ctrl-C's KeyboardInterrupt has no message of its own)."""
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C / SIGINT)"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class RunStatus:
    """Where a stopped run stands: its current charge, whether it read sensitive data, DP-SGD
    steps."""

    charge: ledger.Charge | None  # the current attempt's charge (None: it never reserved)
    accessed: bool  # it read sensitive data: a reserved charge stays until resumed or abandoned
    started_steps: int  # DP-SGD steps started, every attempt (the write-ahead counter)
    planned_steps: int | None  # None: the mechanism runs no DP-SGD
    redo: tuple[ledger.Charge, ...]  # re-charges of steps lost in crashes


def run_status(
    store: Store, *, run_id: str, dataset: str, plan: MechanismPlan, workdir: Path
) -> RunStatus:
    with store.transaction() as con:
        con.execute(LEASES)
        rows = _rows(con, "SELECT charge_id, accessed FROM run_leases WHERE run_id = ?", [run_id])
    charge_id = rows[0]["charge_id"] if rows else None
    charge = ledger.get_charge(store, charge_id) if charge_id else None
    redo = tuple(_redo_charges(store, dataset, charge_id)) if charge_id else ()
    step = plan.step_event
    return RunStatus(
        charge,
        bool(rows and rows[0]["accessed"]),
        step_counter.started(workdir),
        step.steps if step is not None else None,
        redo,
    )


def _executed(plan: MechanismPlan, main_steps: int) -> list[MechanismEvent]:
    step = plan.step_event
    if step is None:
        return list(plan.events)
    if not 0 <= main_steps <= step.steps:
        raise PrivReleaseError(
            f"Inconsistent DP-SGD step counter ({main_steps} of {step.steps} planned); the "
            "reservation stays in force. Report this as a bug."
        )
    events = [e for e in plan.events if e is not step]
    return events + ([replace(step, steps=main_steps)] if main_steps > 0 else [])


def _settle(
    store: Store, dataset: str, plan: MechanismPlan, charge_id: str, workdir: Path, actor: str
) -> list[MechanismEvent]:
    """Commit every redo charge as reserved and the main charge with the started steps
    (write-ahead)."""
    executed: list[MechanismEvent] = []
    redone = 0
    for c in _redo_charges(store, dataset, charge_id):
        ledger.commit(store, c.run_id, c.planned_events, actor=actor)
        executed += c.planned_events
        redone += _steps(c.planned_events)
    main = _executed(plan, step_counter.started(workdir) - redone)
    ledger.commit(store, charge_id, main, actor=actor)
    return main + executed


def _guarantee(store: Store, dataset: str, plan: MechanismPlan) -> Guarantee:
    if plan.guarantee_kind == "dp":
        spent = ledger.budget(store, dataset).spent
        return Guarantee(
            "dp", epsilon_rdp=spent.epsilon_rdp, epsilon_pld=spent.epsilon_pld, delta=spent.delta
        )
    k = plan.parameters.get("k") if plan.guarantee_kind == "k-anonymity" else None
    return Guarantee(
        plan.guarantee_kind,
        k=k,
        method=plan.parameters.get("method"),
        description=str(
            plan.detail.get("guarantee_description")
            # plans stored before mechanisms wrote their own line
            or (f"k-anonymous (k={k})" if k is not None else "")
            or registry.guarantee_label(plan.guarantee_kind)
        ),
    )


def abandon(
    store: Store,
    *,
    run_id: str,
    dataset: str,
    plan: MechanismPlan,
    workdir: Path,
    actor: str = "system",
    lease: Lease | None = None,
) -> ledger.Charge | None:
    """Settle a run that will not be resumed: refunded if it never read sensitive data, else the
    steps started (write-ahead counter) and every re-charge are committed, the rest released. A
    run whose holder died (killed, or a host whose heartbeat lapsed) is taken over first; a live
    holder's is refused (RunInProgressError). With `lease` the caller keeps and releases it."""
    own = lease is None
    lease = acquire_lease(store, run_id, actor) if lease is None else lease
    try:
        charge_id = lease.row["charge_id"]
        charge = ledger.get_charge(store, charge_id) if charge_id else None
        if charge is None or charge.state != "reserved":
            return charge
        if not lease.row["accessed"]:
            return ledger.refund(
                store, charge_id, reason="abandoned before reading sensitive data", actor=actor
            )
        _settle(store, dataset, plan, charge_id, Path(workdir), actor)
        return ledger.get_charge(store, charge_id)
    finally:
        if own:
            lease.release()


def run_direct(
    store: Store,
    dataset: str,
    data: Data,
    public: Data | None,
    mechanism: str,
    config: Any,
    **options: Any,
) -> RunResult:
    """Plan against the dataset's history and run at once, for throw-away ledgers (benchmarks,
    reproduction); `options` are `run_charged`'s keywords (run_id and workdir at least). A
    workspace's real datasets are released through plan -> approval -> run_release."""
    mech = registry.get(mechanism)
    b = ledger.budget(store, dataset)
    plan = mech.plan(config, dataset_info(b.dataset), b.history, public)
    return run_charged(
        store,
        dataset=dataset,
        data=data,
        public=public,
        mechanism=mech,
        config=config,
        plan=plan,
        **options,
    )
