"""`privrelease audit verify|trail`: the hash-chained audit trail."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from accounting import integrity, trail
from release import keys
from release.cli import audit_impl
from release.cli.common import acting, console, fmt_eps, print_json, store, table, workspace
from release.keys import load_public_key, raw_public_bytes

app = typer.Typer(help="Audit trail and release audits.", no_args_is_help=True)
app.command("implementation")(audit_impl.implementation)


@app.command("verify")
def verify(
    checkpoint: list[Path] = typer.Option(
        [],
        "--checkpoint",
        help="A signed checkpoint kept outside the workspace "
        "(repeatable); the workspace's own checkpoints/ are always checked.",
    ),
    key: list[Path] = typer.Option(
        [],
        "--key",
        help="Trust only checkpoints signed by this steward public key "
        "(PEM or base64, repeatable; default: stewards registered in the store).",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Check the hash chain and its head, recompute every dataset's spend from the trail and compare
    it with the ledger tables, and check signed checkpoints. Exit 1 if anything was altered."""
    trusted = [raw_public_bytes(load_public_key(k)) for k in key] or None
    r = integrity.verify_store(store(), checkpoint, trusted)
    v = r.trail
    if as_json:
        print_json(
            {
                "ok": r.ok,
                "status": r.status,
                "length": v.length,
                "head_hash": v.head_hash,
                "problems": r.all_problems,
                "notes": v.notes,
                "broken_entries": v.broken_seqs,
                "spend": r.spend,
                "checkpoints": r.checkpoints,
                "pinned_entry": r.pinned_seq,
                "unpinned_entries": r.unpinned_entries,
            }
        )
    else:
        _print_verification(r)
    if not r.ok:
        raise typer.Exit(1)


def _print_verification(r: integrity.IntegrityReport) -> None:
    v = r.trail
    if r.ok:
        console.print(f"[green]Audit trail intact[/]: {v.length} entries, head {v.head_hash}")
        for n in v.notes:
            console.print(f"  [yellow]interrupted:[/] {escape(n)}")
    else:
        console.print(f"[red]Audit trail BROKEN[/] ({v.length} entries):")
        for p in r.all_problems:
            console.print(f"  - {escape(p)}")
        console.print(
            "The store has been altered outside privrelease. Restore it "
            "from a backup and compare against a pinned head: a signed "
            "checkpoint (`privrelease audit checkpoint`) or a bundle."
        )
    for row in r.spend:
        mark = "[green]agrees[/]" if row["agree"] else "[red]DIFFERS[/]"
        console.print(
            f"  spend of {row['dataset']} recomputed from the trail: epsilon "
            f"{fmt_eps(row['epsilon_rdp_trail'])} (RDP); ledger tables "
            f"{fmt_eps(row['epsilon_rdp_ledger'])}: {mark}"
        )
    for cp in r.checkpoints:
        console.print(
            f"  checkpoint {cp['path']} (entry {cp['seq']}, {cp['steward']}): "
            + ("[green]matches[/]" if cp["ok"] else "[red]does not match[/]")
        )
    if r.ok and r.unpinned_entries:
        which = (
            f"{r.unpinned_entries} of {v.length} entries come after the last signed checkpoint "
            f"(entry {r.pinned_seq})"
            if r.pinned_seq
            else f"none of the {v.length} entries is pinned by a signed checkpoint yet"
        )
        console.print(
            f"  [yellow]not pinned:[/] {which}; deleting the last entries and rewriting trail.head "
            "would not show here. A steward signs one with `privrelease audit checkpoint --as "
            "STEWARD --out FILE`; keep FILE off this machine and check it with `privrelease audit "
            "verify --checkpoint FILE --key STEWARD.pub`."
        )


@app.command("checkpoint")
def checkpoint(
    actor: str = typer.Option(None, "--as", help="The steward signing the head."),
    out: Path = typer.Option(
        None, "--out", help="Also write the checkpoint here (keep it off this machine)."
    ),
) -> None:
    """Sign the audit trail's head with a steward's key (an anchor outside the store). Refused if
    the store does not verify."""
    steward = acting(actor, "steward")
    cp = integrity.make_checkpoint(
        store(), steward.name, keys.load_private_key(workspace(), steward.name)
    )
    if out is not None:
        out.write_text(Path(cp["path"]).read_text())
    console.print(
        f"[green]Checkpoint[/] of entry {cp['seq']} head {cp['head_hash']} signed by "
        f"{steward.name}: {cp['path']}"
    )
    console.print(
        "Keep a copy elsewhere; check later with `privrelease audit verify --checkpoint FILE "
        f"--key {keys.public_key_path(workspace(), steward.name)}`."
    )


@app.command("trail")
def show_trail(
    limit: int = typer.Option(30, "--limit"), as_json: bool = typer.Option(False, "--json")
) -> None:
    """The most recent audit-trail entries."""
    rows = trail.entries(store(), limit)
    if as_json:
        print_json(rows)
        return
    console.print(
        table(
            "Audit trail (newest first)",
            ["#", "time", "actor", "action", "hash"],
            [
                [r["seq"], r["ts"][:19], r["actor"], r["action"], r["entry_hash"][:16] + "…"]
                for r in rows
            ],
        )
    )


_WORKERS = typer.Option(
    0,
    "--workers",
    min=0,
    help="Run the audit's per-item work (the face checks' photos, the volume audit's heads) on a "
    "Dask cluster of N worker processes started on this machine for the audit; the same checks "
    "as one process (docs/scaling-out.md).",
)

_CLUSTER = typer.Option(
    None,
    "--cluster",
    metavar="ADDRESS|FILE",
    help="Run the audit's items on a Dask scheduler the site already runs (tcp://HOST:8786, or "
    "its scheduler file); this machine keeps the store.",
)


@app.command("run")
def run(
    release_id: str,
    actor: str = typer.Option(None, "--as"),
    workers: int = _WORKERS,
    cluster: str | None = _CLUSTER,
) -> None:
    """(Re-)run every check on a synthesised release and store the internal report."""
    from release import manager
    from release.executor import ExecutorChoice
    from release.terminal import rich_progress

    who = acting(actor, "steward", "auditor")
    items_on = ExecutorChoice(workers, cluster)
    if not items_on.in_process:
        console.print(f"Audit items run on {items_on.describe()}.", markup=False, highlight=False)
    with rich_progress() as progress:
        rel = manager.audit_release(store(), release_id, who.name, progress, executor=items_on)
    console.print(f"Release {release_id} is {rel.state}.")
    report(release_id, actor=actor, as_json=False)


@app.command("report")
def report(
    release_id: str,
    actor: str = typer.Option(None, "--as"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The audit report of a release (internal: stewards and auditors only)."""
    from audit import load_report, render_report

    s = store()
    # internal results: a known steward or auditor holding their key
    acting(actor, "steward", "auditor")
    rep = load_report(s, release_id)
    if rep is None:
        console.print(
            f"No audit report for {release_id} yet: run `privrelease audit run {release_id}`."
        )
        raise typer.Exit(1)
    if as_json:
        print(rep.to_json())
        return
    console.print(render_report(rep))
    for r in rep.results:
        for label, path in (r.artifacts or {}).items():
            console.print(f"  [dim]{r.name} {label}: {path}[/]")
    console.print(
        "[green]PASSED[/]: publishable" if rep.passed else "[red]FAILED[/]: publishing is blocked"
    )
