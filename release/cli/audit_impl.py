"""`privrelease audit implementation SPEC`: one-run audit of the DP-SGD code at a spec's settings.

Trains the mechanism's own DP-SGD on public images plus canaries (no sensitive data, no budget) and
compares the empirical epsilon lower bound with the epsilon the ledger would charge for that run."""

from __future__ import annotations

from pathlib import Path

import typer

from release.cli.common import console, print_json, store


def dpsgd_setting_for(spec_path: Path):
    """The DP-SGD run a spec would execute now, and the public data it names
    (release.dpsgd_setting).

    Raises:
        InvalidParameterError: the spec's mechanism registers no DP-SGD trainer for the audit.
    """
    from release.dpsgd_setting import dpsgd_setting
    from release.spec import ReleaseSpec

    spec = ReleaseSpec.from_toml(spec_path)
    return dpsgd_setting(store(), spec, str(spec_path))


def implementation(
    spec: Path = typer.Argument(..., help="Release spec (TOML) whose DP-SGD settings are audited."),
    canaries: int = typer.Option(
        1000, "--canaries", min=10, help="m canaries, each included w.p. 1/2."
    ),
    out: Path = typer.Option(None, "--out", help="Folder for the canary-score PNG and JSON."),
    score: str = typer.Option(
        "gradients",
        "--score",
        help="gradients: every step's privatised gradient (white-box, stronger "
        "at small noise); model: the final weights only.",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """One-run privacy audit (Steinke, Nasr & Jagielski 2023) of the DP-SGD implementation at SPEC's
    settings: public data plus canaries only, no budget spent. Exit 1 if the implementation leaks
    more than it charges; when it passes, the report says what it could not have detected."""
    from audit.dpsgd_audit import check_implementation_audit, compute_implementation_audit
    from release.terminal import rich_progress

    setting, public = dpsgd_setting_for(spec)
    with rich_progress() as progress:
        audit = compute_implementation_audit(
            setting, public, m=canaries, progress=progress, score=score
        )
    result = check_implementation_audit(audit, out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "implementation_audit.json").write_text(audit_json(result))
    if as_json:
        print_json(
            {
                "passed": result.passed,
                "summary": result.summary,
                **result.details,
                "artifacts": result.artifacts,
            }
        )
    else:
        colour = "green" if result.passed else "bold red"
        console.print(f"[{colour}]{result.details['status']}[/]: {result.summary}")
        for label, path in result.artifacts.items():
            console.print(f"  [dim]{label}: {path}[/]")
    if not result.passed:
        raise typer.Exit(1)


def audit_json(result) -> str:
    import json

    from audit.report import jsonable

    return json.dumps(
        jsonable({"passed": result.passed, "summary": result.summary, **result.details}), indent=1
    )
