"""The `privrelease` command line (typer + rich)."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from accounting.errors import PrivReleaseError
from release.cli import audit_trail, budget, datasets
from release.cli.common import STATE, console, err_console, workspace

app = typer.Typer(help="privrelease: privacy-accounted releases of image datasets.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(datasets.app, name="dataset")
app.add_typer(budget.app, name="budget")
app.add_typer(budget.ledger_app, name="ledger")
app.add_typer(audit_trail.app, name="audit")


@app.callback()
def root(
    workspace_dir: Path = typer.Option(None, "--workspace", "-w", envvar="PRIVRELEASE_HOME",
                                       help="Workspace directory (default ./.privrelease)."),
) -> None:
    STATE.workspace = workspace_dir


@app.command("init")
def init() -> None:
    """Create the workspace (store, keys, artifacts, bundles). Safe to run again."""
    ws = workspace()
    created = ws.init()
    console.print(f"[green]{'Initialised' if created else 'Already initialised'}[/] workspace at {ws.root.resolve()}")


def main() -> None:
    """Entry point: user errors are printed as one clear message (no traceback), exit code 2."""
    try:
        app()
    except PrivReleaseError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
