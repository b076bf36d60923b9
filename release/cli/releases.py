"""`privrelease release plan|list|show|approve|reject|run|publish`."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from release import keys, manager
from release.cli.common import actor_name, console, default_actor, fmt_eps, print_json, store, table
from release.cli.progress import rich_progress
from release.records import Release
from release.spec import ReleaseSpec

app = typer.Typer(help="Plan, approve, run and publish releases.", no_args_is_help=True)
AS = typer.Option(None, "--as", help="Identity acting (see `privrelease keys list`); default $PRIVRELEASE_ACTOR.")


def _actor(name: str | None) -> str:
    """The steward acting on a release (see common.actor_name for the default)."""
    return actor_name(name, "steward")


def print_plan(rel: Release) -> None:
    p = rel.plan
    console.print(f"[bold]Release {rel.release_id}[/] ({rel.state}) — {p.mechanism} on {p.dataset}")
    console.print(f"  plan digest: {rel.plan_digest}")
    console.print(f"  events: {'; '.join(p.events_described)}")
    b, a = p.epsilon_before, p.epsilon_after
    console.print(f"  epsilon before: RDP {fmt_eps(b['epsilon_rdp'])}  PLD {fmt_eps(b['epsilon_pld'])}")
    console.print(f"  epsilon after:  RDP {fmt_eps(a['epsilon_rdp'])}  PLD {fmt_eps(a['epsilon_pld'])}"
                  f"   (cap {p.epsilon_cap:g}, delta {a['delta']:g})")
    if p.remaining_after_rdp is not None:
        console.print(f"  remaining after (RDP): {p.remaining_after_rdp:.4f}")
    console.print(f"  images: {p.expected_count}")
    for w in p.warnings:
        console.print(f"  [yellow]warning:[/] {escape(w)}")
    if p.requires_acknowledgement:
        console.print("  [yellow]approval requires --acknowledge-non-dp[/]")


@app.command("plan")
def plan(spec: Path, actor: str = AS, as_json: bool = typer.Option(False, "--json")) -> None:
    """Store a plan from a spec (TOML): events, epsilon before/after by RDP and PLD, warnings."""
    rel = manager.create_plan(store(), ReleaseSpec.from_toml(spec), actor or default_actor())
    if as_json:
        print_json(rel.to_dict())
        return
    print_plan(rel)
    console.print(f"Next: privrelease release approve {rel.release_id} --as STEWARD --digest {rel.plan_digest}")


@app.command("list")
def list_(actor: str = AS, as_json: bool = typer.Option(False, "--json")) -> None:
    """Releases, newest first (a consumer sees only published ones)."""
    s = store()
    viewer = keys.get_identity(s, actor) if actor else None
    rows = manager.list_releases(s, viewer)
    if as_json:
        print_json([{"release_id": r.release_id, "dataset_id": r.dataset_id, "mechanism": r.mechanism,
                     "state": r.state, "created_at": r.created_at, "reason": r.reason} for r in rows])
        return
    console.print(table("Releases", ["id", "dataset", "mechanism", "state", "created", "reason"], [
        [r.release_id, r.dataset_id, r.mechanism, r.state, r.created_at[:19], r.reason or ""]
        for r in rows]))


@app.command("show")
def show(release_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """A release's plan, state, approvals and result."""
    s = store()
    rel = manager.get_release(s, release_id)
    if as_json:
        print_json({**rel.to_dict(), "approvals": manager.approvals(s, release_id)})
        return
    print_plan(rel)
    for a in manager.approvals(s, release_id):
        console.print(f"  {a['decision']} by {a['approver']} at {a['decided_at'][:19]}" +
                      (f": {a['reason']}" if a["reason"] else ""))
    if rel.result:
        console.print(f"  guarantee: {rel.guarantee}")
        if rel.bundle:
            console.print(f"  bundle: {rel.bundle['tarball']}")


@app.command("approve")
def approve(release_id: str, actor: str = AS,
            digest: str = typer.Option(None, "--digest", help="The plan digest you reviewed (refused if different)."),
            acknowledge_non_dp: bool = typer.Option(False, "--acknowledge-non-dp",
                                                    help="Accept that a k-anonymous release voids DP guarantees.")) -> None:
    """Sign the plan's digest as a steward."""
    rel = manager.approve(store(), release_id, _actor(actor), digest=digest, acknowledge_non_dp=acknowledge_non_dp)
    console.print(f"[green]Approved[/] {release_id} (plan {rel.plan_digest[:16]}…). Next: privrelease release run {release_id}")


@app.command("reject")
def reject(release_id: str, reason: str = typer.Option(..., "--reason"), actor: str = AS) -> None:
    """Reject a plan, with a reason (recorded in the audit trail)."""
    manager.reject(store(), release_id, _actor(actor), reason)
    console.print(f"[yellow]Rejected[/] {release_id}: {escape(reason)}")


@app.command("run")
def run(release_id: str, actor: str = AS,
        nproc: int = typer.Option(1, "--nproc", min=1, help="Train PrivImage on N processes under torchrun (one per "
                                  "GPU, or CPU processes); charged once, exactly as one process "
                                  "(docs/scaling-out.md).")
        ) -> None:
    """Execute an approved plan (reserve -> synthesise -> commit), then audit it. Re-run a failed one to resume."""
    with rich_progress() as progress:
        rel = manager.run_release(store(), release_id, _actor(actor), progress, nproc=nproc)
    _print_outcome(rel)


@app.command("abandon")
def abandon(release_id: str, actor: str = AS) -> None:
    """Settle a failed release for good: refunded if it never read the data, else the steps it started stay charged."""
    rel = manager.abandon_release(store(), release_id, _actor(actor))
    console.print(f"[yellow]Abandoned[/] {release_id}: {escape(rel.reason)}")


def _print_outcome(rel: Release) -> None:
    from audit import load_report

    report = load_report(store(), rel.release_id)
    verdict = "[green]all checks passed[/]" if report and report.passed else "[red]some checks FAILED[/]"
    console.print(f"Release {rel.release_id} is {rel.state}: {verdict}. "
                  f"See `privrelease audit report {rel.release_id}`.")


@app.command("publish")
def publish(release_id: str, actor: str = AS, as_json: bool = typer.Option(False, "--json")) -> None:
    """Write the signed bundle (refused unless every audit check passed)."""
    rel = manager.publish(store(), release_id, _actor(actor))
    b = rel.bundle or {}
    if as_json:
        print_json(b)
        return
    console.print(f"[green]Published[/] {release_id}\n  bundle:  {b['path']}\n  archive: {b['tarball']}\n"
                  f"  sha256:  {b['tarball_sha256']}\n  verify:  privrelease verify {b['tarball']} --key {b['public_key']}")
