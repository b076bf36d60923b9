"""`privrelease audit verify|trail`: the hash-chained audit trail."""
from __future__ import annotations

import typer

from accounting import trail
from release.cli.common import console, print_json, store, table

app = typer.Typer(help="Audit trail and release audits.", no_args_is_help=True)


@app.command("verify")
def verify(as_json: bool = typer.Option(False, "--json")) -> None:
    """Check the hash chain; print its head hash (pin it elsewhere). Exit 1 if broken."""
    v = trail.verify(store())
    if as_json:
        print_json({"ok": v.ok, "length": v.length, "head_hash": v.head_hash, "problems": v.problems,
                    "broken_entries": v.broken_seqs})
    elif v.ok:
        console.print(f"[green]Audit trail intact[/]: {v.length} entries, head {v.head_hash}")
    else:
        console.print(f"[red]Audit trail BROKEN[/] ({v.length} entries):")
        for p in v.problems:
            console.print(f"  - {p}")
        console.print("The store has been altered outside privrelease. Restore it from a backup and compare "
                      "against a pinned head hash (every signed bundle records one).")
    if not v.ok:
        raise typer.Exit(1)


@app.command("trail")
def show_trail(limit: int = typer.Option(30, "--limit"), as_json: bool = typer.Option(False, "--json")) -> None:
    """The most recent audit-trail entries."""
    rows = trail.entries(store(), limit)
    if as_json:
        print_json(rows)
        return
    console.print(table("Audit trail (newest first)", ["#", "time", "actor", "action", "hash"],
                        [[r["seq"], r["ts"][:19], r["actor"], r["action"], r["entry_hash"][:16] + "…"] for r in rows]))


@app.command("run")
def run(release_id: str, actor: str = typer.Option(None, "--as")) -> None:
    """(Re-)run every check on a synthesised release and store the internal report."""
    from release import manager
    from release.cli.common import default_actor
    from release.cli.progress import rich_progress

    with rich_progress() as progress:
        rel = manager.audit_release(store(), release_id, actor or default_actor(), progress)
    console.print(f"Release {release_id} is {rel['state']}.")
    report(release_id, actor=actor, as_json=False)


@app.command("report")
def report(release_id: str, actor: str = typer.Option(None, "--as"), as_json: bool = typer.Option(False, "--json")) -> None:
    """The audit report of a release (internal: stewards and auditors only)."""
    from audit import load_report, render_report
    from release import keys
    from release.cli.common import default_actor

    s = store()
    name = actor or default_actor()
    try:
        ident = keys.get_identity(s, name)
    except keys.UnknownIdentityError:
        ident = None  # the workspace owner on the command line
    if ident is not None:
        keys.require_role(ident, "steward", "auditor")
    rep = load_report(s, release_id)
    if rep is None:
        console.print(f"No audit report for {release_id} yet: run `privrelease audit run {release_id}`.")
        raise typer.Exit(1)
    if as_json:
        print(rep.to_json())
        return
    console.print(render_report(rep))
    for r in rep.results:
        for label, path in (r.artifacts or {}).items():
            console.print(f"  [dim]{r.name} {label}: {path}[/]")
    console.print("[green]PASSED[/]: publishable" if rep.passed else "[red]FAILED[/]: publishing is blocked")
