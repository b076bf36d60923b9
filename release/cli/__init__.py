"""The `privrelease` command line (typer + rich)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.markup import escape

from accounting.errors import PrivReleaseError
from accounting.store import Store
from release.cli import audit_trail, budget, datasets, keys_verify, releases, store_cmd, synth_cmds
from release.cli.common import STATE, console, err_console, workspace
from release.terminal import say_our_warnings

app = typer.Typer(
    help="privrelease: privacy-accounted releases of image datasets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(datasets.app, name="dataset")
app.add_typer(budget.app, name="budget")
app.add_typer(budget.ledger_app, name="ledger")
app.add_typer(audit_trail.app, name="audit")
app.add_typer(releases.app, name="release")
app.add_typer(keys_verify.keys_app, name="keys")
app.add_typer(synth_cmds.app, name="synth")
app.add_typer(store_cmd.app, name="store")
app.command("verify")(keys_verify.verify)


@app.command("dashboard")
def dashboard(
    port: int = typer.Option(8501, "--port"), host: str = typer.Option("127.0.0.1", "--host")
) -> None:
    """Start the Streamlit dashboard on localhost over this workspace."""
    app_path = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    env_ws = str(workspace().root.resolve())
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app_path),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]
    console.print(f"Dashboard on http://{host}:{port} (workspace {env_ws}); Ctrl-C to stop.")
    sys.stdout.flush()
    # this process becomes the server (same pid): SIGTERM or SIGKILL from a service manager stops
    # it, where a child started by subprocess outlived the command as an orphan serving the data
    os.execve(sys.executable, cmd, {**os.environ, "PRIVRELEASE_HOME": env_ws})


@app.callback()
def root(
    workspace_dir: Path = typer.Option(
        None,
        "--workspace",
        "-w",
        envvar="PRIVRELEASE_HOME",
        help="Workspace directory (default ./.privrelease).",
    ),
) -> None:
    STATE.workspace = workspace_dir


@app.command("init")
def init(
    steward: str = typer.Option(
        None,
        "--steward",
        help="Create the workspace's first steward (only a steward can add identities later).",
    ),
    store_url: str = typer.Option(
        None,
        "--store",
        help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE: keep "
        "the ledger in this shared database instead of the workspace's store.duckdb "
        "(docs/scaling-out.md).",
    ),
) -> None:
    """Create the workspace (store, keys, artifacts, bundles; mode 0700). Safe to run again."""
    from accounting.errors import PermissionDeniedError
    from release import keys

    ws = workspace()
    created = ws.init(store_url=store_url)
    console.print(
        f"[green]{'Initialised' if created else 'Already initialised'}[/] "
        f"workspace at {ws.root.resolve()}"
    )
    if steward is not None:
        s = Store(ws)
        if keys.has_steward(s):
            raise PermissionDeniedError(
                "This workspace already has a steward; add another with `privrelease keys create "
                f"{steward} --role steward --as STEWARD`."
            )
        ident = keys.create_identity(s, steward, "steward", actor=steward)
        keys.ensure_release_key(ws)
        console.print(
            f"[green]Created[/] first steward {ident.name}; "
            f"private key {keys.private_key_path(ws, steward)} "
            "(keep it private: it is the steward's authority)."
        )


def main() -> None:
    """Entry point: user errors are printed as one clear message (no traceback), exit code 2."""
    say_our_warnings()
    try:
        app()
    except PrivReleaseError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}")  # paths may hold [ ]
        sys.exit(2)
