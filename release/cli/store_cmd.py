"""`privrelease store info|migrate`: where the workspace's tables live (DuckDB file or
PostgreSQL)."""

from __future__ import annotations

import typer

from accounting import trail
from accounting.store import Store
from accounting.store_backends import redact
from release.cli.common import acting, console, print_json, table, workspace

app = typer.Typer(
    help="The workspace's store: local DuckDB file (default) or a shared PostgreSQL database.",
    no_args_is_help=True,
)


@app.command("info")
def info(as_json: bool = typer.Option(False, "--json")) -> None:
    """Which store the workspace uses, and what stays local to it."""
    ws = workspace()
    url = ws.store_url
    out = {
        "backend": "postgresql" if url else "duckdb",
        "location": redact(url) if url else str(ws.db_path),
        "local": [str(ws.keys), str(ws.artifacts), str(ws.bundles), str(ws.trail_head_path)],
    }
    if as_json:
        print_json(out)
    else:
        console.print(f"store: {out['backend']} at {out['location']}")
        console.print("kept in this workspace only: " + ", ".join(out["local"]))


@app.command("migrate")
def migrate(
    to: str = typer.Option(
        ...,
        "--to",
        help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE of an empty "
        "database; the workspace switches to it once the copy verifies.",
    ),
    as_: str = typer.Option(
        None, "--as", help="The steward doing it (default $PRIVRELEASE_ACTOR)."
    ),
) -> None:
    """Copy this workspace's DuckDB store into an empty PostgreSQL database, verify the copy (audit
    trail chain and head, ledger replayed from the trail) and switch the workspace to it.
    store.duckdb is left as it was, no longer used. Refuses a target database that already holds
    rows."""
    from accounting.store_migrate import migrate_to_postgres

    ident = acting(as_, "steward")
    ws = workspace()
    m = migrate_to_postgres(ws, to)
    store = Store(ws)
    with store.transaction() as con:
        trail.append(
            con,
            store,
            ident.name,
            "store.migrate",
            {"to": redact(to), "rows": m.rows, "head_seq": m.head[0], "head_hash": m.head[1]},
        )
    console.print(
        table(
            "Copied into PostgreSQL", ["table", "rows"], [[t, n] for t, n in sorted(m.rows.items())]
        )
    )
    console.print(
        f"[green]Verified[/]: the trail ends at entry {m.head[0]} ({m.head[1][:12]}…) in both "
        f"stores. This workspace now uses {redact(to)}; {ws.db_path.name} is kept, unused."
    )
