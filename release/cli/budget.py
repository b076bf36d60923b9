"""`privrelease budget show|plan` and `privrelease ledger show`."""

from __future__ import annotations

from typing import Any

import typer

from accounting import curve, ledger
from release import budget as budgets
from release.cli.common import console, fmt_eps, print_json, store, table

app = typer.Typer(
    help="Privacy budgets: what was spent, and what-if planning.", no_args_is_help=True
)
ledger_app = typer.Typer(help="The budget ledger across all datasets.", no_args_is_help=True)


def print_adaptive(s: budgets.BudgetSummary) -> None:
    """The two figures that hold when each release was chosen after seeing the earlier ones."""
    console.print(f"  cap check (privacy filter): {fmt_eps(s.filter_epsilon)} of {s.epsilon_cap:g}")
    console.print(
        f"  spent so far (odometer): epsilon <= {fmt_eps(s.odometer_epsilon)} at delta={s.delta:g}"
    )
    console.print(
        "  [dim]RDP/PLD: the history as if fixed in advance. Filter: new "
        "charges stop when it would pass the cap. Odometer: holds now "
        "and later, however releases were chosen (docs/privacy.md).[/]"
    )


@app.command("show")
def show(dataset: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Cap, spend by RDP (reference) and PLD, remaining, and per-charge breakdown."""
    b = budgets.budget(store(), dataset)
    summary, rows = budgets.summary(b), budgets.breakdown(b)
    if as_json:
        print_json({**summary.to_dict(), "charges": [r.to_dict() for r in rows]})
        return
    console.print(
        f"[bold]{summary.dataset}[/] ({summary.dataset_id}) cap epsilon={summary.epsilon_cap:g}, "
        f"delta={summary.delta:g}"
    )
    console.print(
        f"  spent   RDP: {fmt_eps(summary.spent_epsilon_rdp)}   PLD: "
        f"{fmt_eps(summary.spent_epsilon_pld)}"
    )
    console.print(f"  remaining (cap - RDP): {summary.remaining_epsilon_rdp:.4f}")
    print_adaptive(summary)
    if summary.dp_void:
        console.print(
            "  [red]A release without a DP guarantee (k-anonymity, de-identification) was made "
            "from this dataset: its DP guarantees no longer hold.[/]"
        )
    console.print(
        table(
            "Charges",
            ["#", "run", "state", "events", "eps RDP", "eps PLD", "cum. RDP", "cum. PLD"],
            [
                [
                    r.position,
                    r.run_id,
                    r.state,
                    r.events,
                    fmt_eps(r.epsilon_rdp),
                    fmt_eps(r.epsilon_pld),
                    fmt_eps(r.cumulative_epsilon_rdp),
                    fmt_eps(r.cumulative_epsilon_pld),
                ]
                for r in rows
            ],
        )
    )


@app.command("plan")
def plan(
    sample_rate: float = typer.Option(
        ..., "--sample-rate", help="Poisson sampling rate q = batch / n."
    ),
    steps: int = typer.Option(..., "--steps", help="Number of DP-SGD steps."),
    sigma: float = typer.Option(None, "--sigma", help="Noise multiplier; give this or --epsilon."),
    epsilon: float = typer.Option(
        None, "--epsilon", help="Target epsilon: prints the conservative sigma."
    ),
    delta: float = typer.Option(None, "--delta", help="Delta (default: the dataset's delta cap)."),
    dataset: str = typer.Option(
        None, "--dataset", help="Compose with this dataset's spend so far."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """What-if: epsilon of a DP-SGD run by RDP and PLD (or the sigma for a target epsilon). Changes
    nothing."""
    history = budgets.budget(store(), dataset) if dataset is not None else None
    w = budgets.what_if(
        sample_rate, steps, sigma=sigma, epsilon=epsilon, delta=delta, history=history
    )
    if as_json:
        print_json(w.to_dict())
        return
    what = f"DP-SGD q={sample_rate:g}, sigma={w.sigma:.6g}, steps={steps}, delta={w.delta:g}"
    console.print(f"[bold]{what}[/]" + (f", composed with {dataset}'s spend" if dataset else ""))
    console.print(f"  epsilon RDP (reference): {fmt_eps(w.epsilon_rdp)}")
    console.print(f"  epsilon PLD (tighter):   {fmt_eps(w.epsilon_pld)}")
    if epsilon is not None:
        console.print(f"  conservative sigma for epsilon <= {epsilon:g}: {w.sigma:.6g}")
    if w.epsilon_cap is not None:
        colour = "green" if w.fits_cap else "red"
        console.print(
            f"  [{colour}]{'fits' if w.fits_cap else 'exceeds'} the cap {w.epsilon_cap:g}: the "
            f"cap's privacy filter would be at {w.filter_epsilon:.4f} (RDP remaining after: "
            f"{w.remaining_after_rdp:.4f})[/]"
        )


@app.command("verify")
def verify(as_json: bool = typer.Option(False, "--json")) -> None:
    """The auditor's check: recompute every dataset's RDP curve from its stored events and compare
    it with the running curve the ledger keeps (and charges against). Exit 1 on any difference
    beyond float error."""
    s = store()
    with s.transaction() as con:
        rows = curve.verify(con)
    if as_json:
        print_json(rows)
    else:
        console.print(
            table(
                "Running RDP curve vs. recomputed from the stored events",
                ["dataset", "running eps", "recomputed eps", "max |diff| per order", "agree"],
                [
                    [
                        r["dataset"],
                        fmt_eps(r["epsilon_rdp_running"]),
                        fmt_eps(r["epsilon_rdp_recomputed"]),
                        "-"
                        if r["max_abs_rdp_difference"] is None
                        else f"{r['max_abs_rdp_difference']:.2e}",
                        "yes" if r["agree"] else "[red]NO[/]",
                    ]
                    for r in rows
                ],
            )
        )
    if not all(r["agree"] for r in rows):
        raise typer.Exit(1)


@ledger_app.command("show")
def ledger_show(
    dataset: str = typer.Option(None, "--dataset"), as_json: bool = typer.Option(False, "--json")
) -> None:
    """Every charge in the ledger, oldest first (optionally one dataset)."""
    pairs = ledger.all_charges(store())
    rows: list[dict[str, Any]] = [
        {
            "position": c.position,
            "dataset": d.name,
            "run_id": c.run_id,
            "state": c.state,
            "planned": "; ".join(e.describe() for e in c.planned_events),
            "charged": "; ".join(e.describe() for e in c.charged_events),
            "actor": c.actor,
            "reserved_at": c.reserved_at,
            "settled_at": c.settled_at,
            "description": c.description,
        }
        for d, c in pairs
        if dataset in (None, d.name, d.dataset_id)
    ]
    if as_json:
        print_json(rows)
        return
    console.print(
        table(
            "Ledger",
            ["#", "dataset", "run", "state", "planned", "charged", "actor", "reserved"],
            [
                [
                    r["position"],
                    r["dataset"],
                    r["run_id"],
                    r["state"],
                    r["planned"],
                    r["charged"] or "-",
                    r["actor"],
                    r["reserved_at"][:19],
                ]
                for r in rows
            ],
        )
    )
    if not rows:
        console.print("[dim]No charges yet.[/]")
