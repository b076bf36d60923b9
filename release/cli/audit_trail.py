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
