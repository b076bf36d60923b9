"""`privrelease release plan|list|show|approve|reject|run|publish`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from release import keys, manager, views
from release.cli.common import (
    actor_name,
    console,
    default_actor,
    err_console,
    print_json,
    store,
    table,
)
from release.records import Release
from release.spec import ReleaseSpec
from release.terminal import print_plan, rich_progress, run_notices

if TYPE_CHECKING:
    from release.executor import ExecutorChoice
    from synth.tools.nodes import Nodes

app = typer.Typer(help="Plan, approve, run and publish releases.", no_args_is_help=True)
AS = typer.Option(
    None, "--as", help="Identity acting (see `privrelease keys list`); default $PRIVRELEASE_ACTOR."
)


def _actor(name: str | None) -> str:
    """The steward acting on a release (see common.actor_name for the default)."""
    return actor_name(name, "steward")


@app.command("plan")
def plan(spec: Path, actor: str = AS, as_json: bool = typer.Option(False, "--json")) -> None:
    """Store a plan from a spec (TOML): events, epsilon before/after by RDP and PLD, warnings."""
    with rich_progress(
        err_console if as_json else console
    ) as progress:  # calibration takes a while
        rel = manager.create_plan(
            store(), ReleaseSpec.from_toml(spec), actor or default_actor(), progress
        )
    if as_json:
        print_json(rel.to_dict())
        return
    print_plan(rel)
    console.print(
        f"Next: privrelease release approve {rel.release_id} "
        f"--as STEWARD --digest {rel.plan_digest}"
    )


@app.command("list")
def list_(actor: str = AS, as_json: bool = typer.Option(False, "--json")) -> None:
    """Releases, newest first (a consumer sees only published ones)."""
    s = store()
    viewer = keys.get_identity(s, actor) if actor else None
    rows = manager.list_releases(s, viewer)
    if as_json:
        print_json(
            [
                {
                    "release_id": r.release_id,
                    "dataset_id": r.dataset_id,
                    "mechanism": r.mechanism,
                    "state": r.state,
                    "created_at": r.created_at,
                    "reason": r.reason,
                }
                for r in rows
            ]
        )
        return
    console.print(
        table(
            "Releases",
            ["id", "dataset", "mechanism", "state", "created", "reason"],
            [
                [
                    r.release_id,
                    r.dataset_id,
                    r.mechanism,
                    r.state,
                    r.created_at[:19],
                    r.reason or "",
                ]
                for r in rows
            ],
        )
    )


@app.command("show")
def show(release_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """A release's plan, state, approvals and result."""
    s = store()
    rel = manager.get_release(s, release_id)
    tried = views.attempts(s, release_id)
    if as_json:
        print_json(
            {
                **rel.to_dict(),
                "approvals": manager.approvals(s, release_id),
                "attempts": [a.to_dict() for a in tried],
            }
        )
        return
    print_plan(rel)
    for a in manager.approvals(s, release_id):
        console.print(
            f"  {a['decision']} by {a['approver']} at {a['decided_at'][:19]}"
            + (f": {a['reason']}" if a["reason"] else "")
        )
    if rel.reason:
        console.print(f"  reason: {rel.reason}", markup=False, highlight=False)
    for attempt in tried:  # the run's attempts: when, how each ended, its items
        console.print(f"  {attempt.describe()}", markup=False, highlight=False)
    if rel.result:
        console.print(f"  guarantee: {rel.guarantee}")
        if rel.bundle:
            console.print(f"  bundle: {rel.bundle['tarball']}")


@app.command("approve")
def approve(
    release_id: str,
    actor: str = AS,
    digest: str = typer.Option(
        None, "--digest", help="The plan digest you reviewed (refused if different)."
    ),
    acknowledge_non_dp: bool = typer.Option(
        False,
        "--acknowledge-non-dp",
        help="Accept that a release without a DP guarantee (k-anonymity, de-identification) "
        "voids the dataset's DP guarantees.",
    ),
) -> None:
    """Sign the plan's digest as a steward."""
    rel = manager.approve(
        store(), release_id, _actor(actor), digest=digest, acknowledge_non_dp=acknowledge_non_dp
    )
    console.print(
        f"[green]Approved[/] {release_id} (plan {rel.plan_digest[:16]}…). Next: privrelease "
        f"release run {release_id}"
    )


@app.command("reject")
def reject(release_id: str, reason: str = typer.Option(..., "--reason"), actor: str = AS) -> None:
    """Reject a plan, with a reason (recorded in the audit trail)."""
    manager.reject(store(), release_id, _actor(actor), reason)
    console.print(f"[yellow]Rejected[/] {release_id}: {escape(reason)}")


_NPROC = typer.Option(
    1,
    "--nproc",
    min=1,
    help="Train PrivImage on N processes under torchrun (one per "
    "GPU, or CPU processes); charged once, exactly as one process (docs/scaling-out.md).",
)

_WORKERS = typer.Option(
    0,
    "--workers",
    min=0,
    help="Run a per-item mechanism's items (face-deid's photos, deface and reface's heads, "
    "k-SALSA's cluster batches, DP-MERF's feature sums), then the audit's (the face checks' "
    "photos, the volume audit's heads), on a Dask cluster of N worker processes started on "
    "this machine for each; the same result as one process, charged once, here "
    "(docs/scaling-out.md).",
)

_CLUSTER = typer.Option(
    None,
    "--cluster",
    metavar="ADDRESS|FILE",
    help="Run the items (the mechanism's, then the audit's) on a Dask scheduler the site "
    "already runs (tcp://HOST:8786, or its scheduler file); this machine keeps the ledger and "
    "the lease.",
)

_RETRIES = typer.Option(
    2,
    "--retries",
    min=0,
    max=10,
    help="Hand an item out again this many times when its process or worker died, or it timed "
    "out; the same failure twice, or a failure about the data, stops the run at once, naming "
    "the item (finished items are kept: run again to resume).",
)

_NNODES = typer.Option(
    None,
    "--nnodes",
    help="Train PrivImage across N hosts: run the same command on every host, with --rdzv. "
    "Node rank 0, the coordinator, holds the ledger, charges once and writes the release; "
    "the others only train (docs/scaling-out.md).",
)

_RDZV = typer.Option(
    None,
    "--rdzv",
    metavar="HOST:PORT",
    help="With --nnodes: the rendezvous endpoint every host reaches, a free port on the "
    "coordinator (torchrun's c10d rendezvous, id = the release id).",
)

_NPROC_PER_NODE = typer.Option(
    None,
    "--nproc-per-node",
    help="With --nnodes: processes on each host (one per GPU); default 1.",
)

_NODE_RANK = typer.Option(
    None,
    "--node-rank",
    help="With --nnodes: 0 on the coordinator, 1..N-1 on the others; default 0 on the host "
    "whose address is the --rdzv HOST, else 1.",
)


@app.command("run")
def run(
    release_id: str,
    actor: str = AS,
    nproc: int = _NPROC,
    workers: int = _WORKERS,
    cluster: str | None = _CLUSTER,
    retries: int = _RETRIES,
    nnodes: int | None = _NNODES,
    rdzv: str | None = _RDZV,
    nproc_per_node: int | None = _NPROC_PER_NODE,
    node_rank: int | None = _NODE_RANK,
) -> None:
    """Execute an approved plan (reserve -> synthesise -> commit), then audit it. Re-run a failed
    one to resume."""
    from release.executor import ExecutorChoice
    from synth.tools.nodes import parse_nodes

    nodes = parse_nodes(nnodes, rdzv, nproc_per_node, node_rank, nproc)
    if nodes is not None and not nodes.coordinator:
        _follow(release_id, nodes)
        return
    name = _actor(actor)
    items_on = ExecutorChoice(workers, cluster, retries)
    _print_placement(items_on, nodes, nproc)
    last: list[tuple[str, int, int]] = []
    try:
        with _second_interrupt_waits(), rich_progress() as progress, run_notices():

            def track(stage: str, done: int, total: int) -> None:
                last[:] = [(stage, done, total)]
                progress(stage, done, total)

            rel = manager.run_release(
                store(), release_id, name, track, nproc=nproc, executor=items_on, nodes=nodes
            )
    except KeyboardInterrupt as exc:
        from release.runner import Terminated

        terminated = isinstance(exc, Terminated)
        _print_interrupted(release_id, name, last[0] if last else None, terminated)
        raise typer.Exit(143 if terminated else 130) from None
    _print_outcome(rel)


def _follow(release_id: str, nodes: Nodes) -> None:
    """`run` on a host other than the coordinator: train this host's ranks only, charge nothing."""
    console.print(
        f"This host follows the coordinator of {release_id} (rendezvous {nodes.rdzv}): it "
        "trains only; the coordinator charges and writes the release.",
        markup=False,
        highlight=False,
    )
    with rich_progress() as progress:
        manager.follow_release(store(), release_id, nodes, progress)
    console.print(f"Done: this host's part of {release_id} finished.", markup=False)


def _print_placement(items_on: ExecutorChoice, nodes: Nodes | None, nproc: int) -> None:
    """Say where the run's work goes: item workers, the hosts, or this process's torch threads."""
    from release import threads

    if not items_on.in_process:
        console.print(f"Items run on {items_on.describe()}.", markup=False, highlight=False)
    if nodes is not None:
        console.print(
            f"Coordinator of {nodes.nnodes} hosts (rendezvous {nodes.rdzv}, "
            f"{nodes.nproc_per_node} processes each): start the same command on the others.",
            markup=False,
            highlight=False,
        )
    elif nproc == 1:
        console.print(
            f"CPU threads for torch: {threads.apply().reason}", markup=False, highlight=False
        )


@contextmanager
def _second_interrupt_waits() -> Iterator[None]:
    """The first Ctrl-C (or SIGTERM, what a service manager or `kill` sends) stops the run; while
    the store records that (state, refund), a second one only says to wait, so that it cannot leave
    the release half-recorded."""
    from release.runner import Terminated

    def first(signum, frame) -> None:
        signal.signal(signal.SIGINT, later)
        signal.signal(signal.SIGTERM, later)
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    def later(signum, frame) -> None:
        err_console.print("Stopping: recording the interruption in the store, one moment.")

    previous = {sig: signal.signal(sig, first) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _events(events) -> str:
    return "; ".join(e.describe() for e in events)


def _print_interrupted(
    release_id: str, actor: str, stage: tuple[str, int, int] | None, terminated: bool = False
) -> None:
    """What a Ctrl-C left behind: the release's state, what is charged, and the commands that go
    on."""
    s = store()
    rel = manager.get_release(s, release_id)
    where = f" during {stage[0]} ({stage[1]}/{stage[2]})" if stage else ""

    def say(text: str) -> None:  # verbatim, and unwrapped so that a command stays on one line
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    how = "Terminated (SIGTERM)" if terminated else "Interrupted (Ctrl-C)"
    say(f"{how}{where}: release {release_id} is {rel.state}.")
    resume = f"privrelease release run {release_id} --as {actor}"
    if rel.state in ("approved", "planned"):
        say(f"Charged: nothing (it stopped before reserving any budget). Run it: {resume}")
        return
    st = views.run_status(s, release_id)
    charge = st.charge
    if rel.result is not None:
        settled = f" ({_events(charge.charged_events)} committed)" if charge else ""
        say(
            f"Charged: the synthesis had finished and is settled{settled}; only the audit was "
            f"interrupted. Audit it again: {resume}"
        )
        return
    if charge is None or charge.state == "refunded":
        say(
            "Charged: nothing. It stopped before reading the "
            "sensitive data, so its reservation was refunded."
        )
        say(f"Resume (a new attempt, reserved again): {resume}")
        return
    steps = (
        f"; {min(st.started_steps, st.planned_steps)} of "
        f"{st.planned_steps} DP-SGD steps were started"
        if st.planned_steps is not None
        else ""
    )
    say(
        "Charged: it had read the sensitive data, so its reservation "
        f"({_events(charge.planned_events)}) stays in force, counted in full against the cap, "
        f"until you resume or settle it{steps}."
    )
    say(
        "Resume (from its last checkpoint; steps lost "
        f"since then are charged again first): {resume}"
    )
    kept = "the DP-SGD steps it started" if st.planned_steps is not None else "the whole run"
    say(
        f"Or settle it for good (keeps {kept} charged, refunds the rest): privrelease release "
        f"abandon {release_id} --as {actor}"
    )


@app.command("abandon")
def abandon(release_id: str, actor: str = AS) -> None:
    """Settle a failed release for good (or one left running by a run that was killed): refunded if
    it never read the data, else the steps it started stay charged."""
    rel = manager.abandon_release(store(), release_id, _actor(actor))
    console.print(f"[yellow]Abandoned[/] {release_id}: {escape(rel.reason or '')}")


def _print_outcome(rel: Release) -> None:
    from audit import load_report

    report = load_report(store(), rel.release_id)
    verdict = (
        "[green]all checks passed[/]" if report and report.passed else "[red]some checks FAILED[/]"
    )
    console.print(
        f"Release {rel.release_id} is {rel.state}: {verdict}. "
        f"See `privrelease audit report {rel.release_id}`."
    )


@app.command("publish")
def publish(
    release_id: str, actor: str = AS, as_json: bool = typer.Option(False, "--json")
) -> None:
    """Write the signed bundle (refused unless every audit check passed)."""
    name = _actor(actor)
    rel = manager.publish(store(), release_id, name)
    b = rel.bundle or {}
    if as_json:
        print_json(b)
        return
    console.print(
        f"[green]Published[/] {release_id}\n  bundle:  {b['path']}\n  "
        f"archive: {b['tarball']}\n  sha256:  {b['tarball_sha256']}\n  "
        f"verify:  privrelease verify {b['tarball']} --key {b['public_key']}\n"
        f"  next:    privrelease audit checkpoint --as {name} --out FILE "
        "(signs the audit trail's head; keep FILE off this machine)"
    )
