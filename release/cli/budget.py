"""`privrelease budget show|plan` and `privrelease ledger show`."""
from __future__ import annotations


import typer

from accounting import curve, ledger
from accounting import filter as privacy_filter
from accounting.calibration import calibrate_dpsgd_sigma
from accounting.epsilon import epsilon_report
from accounting.errors import InvalidParameterError
from accounting.events import DpSgd
from release.cli.common import console, fmt_eps, print_json, store, table
from release.manager import charge_breakdown

app = typer.Typer(help="Privacy budgets: what was spent, and what-if planning.", no_args_is_help=True)
ledger_app = typer.Typer(help="The budget ledger across all datasets.", no_args_is_help=True)


def budget_summary(b: ledger.Budget) -> dict:
    return {
        "dataset": b.dataset.name, "dataset_id": b.dataset.dataset_id, "epsilon_cap": b.dataset.epsilon_cap,
        "delta": b.dataset.delta_cap, "spent_epsilon_rdp": b.spent.epsilon_rdp, "spent_epsilon_pld": b.spent.epsilon_pld,
        "remaining_epsilon_rdp": b.remaining_rdp, "dp_void": b.dp_void,
        "filter_epsilon": _finite(b.filter_epsilon), "filter_admits_more": b.filter_epsilon < b.dataset.epsilon_cap,
        "odometer_epsilon": _finite(b.odometer_epsilon),
    }


def _finite(x: float) -> float | None:
    return x if x != float("inf") else None


def print_adaptive(b: ledger.Budget) -> None:
    """The two figures that hold when each release was chosen after seeing the earlier ones."""
    d = b.dataset
    console.print(f"  cap check (privacy filter): {fmt_eps(b.filter_epsilon)} of {d.epsilon_cap:g}")
    console.print(f"  spent so far (odometer): epsilon <= {fmt_eps(b.odometer_epsilon)} at delta={d.delta_cap:g}")
    console.print("  [dim]RDP/PLD: the history as if fixed in advance. Filter: new charges stop when it would pass "
                  "the cap. Odometer: holds now and later, however releases were chosen (docs/privacy.md).[/]")


@app.command("show")
def show(dataset: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Cap, spend by RDP (reference) and PLD, remaining, and per-charge breakdown."""
    b = ledger.budget(store(), dataset)
    summary, rows = budget_summary(b), charge_breakdown(b)
    if as_json:
        print_json({**summary, "charges": rows})
        return
    d = b.dataset
    console.print(f"[bold]{d.name}[/] ({d.dataset_id}) cap epsilon={d.epsilon_cap:g}, delta={d.delta_cap:g}")
    console.print(f"  spent   RDP: {fmt_eps(b.spent.epsilon_rdp)}   PLD: {fmt_eps(b.spent.epsilon_pld)}")
    console.print(f"  remaining (cap - RDP): {b.remaining_rdp:.4f}")
    print_adaptive(b)
    if b.dp_void:
        console.print("  [red]A non-DP (k-anonymous) release was made from this dataset: its DP guarantees no longer hold.[/]")
    console.print(table("Charges", ["#", "run", "state", "events", "eps RDP", "eps PLD", "cum. RDP", "cum. PLD"], [
        [r["position"], r["run_id"], r["state"], r["events"], fmt_eps(r["epsilon_rdp"]), fmt_eps(r["epsilon_pld"]),
         fmt_eps(r["cumulative_epsilon_rdp"]), fmt_eps(r["cumulative_epsilon_pld"])] for r in rows
    ]))


@app.command("plan")
def plan(
    sample_rate: float = typer.Option(..., "--sample-rate", help="Poisson sampling rate q = batch / n."),
    steps: int = typer.Option(..., "--steps", help="Number of DP-SGD steps."),
    sigma: float = typer.Option(None, "--sigma", help="Noise multiplier; give this or --epsilon."),
    epsilon: float = typer.Option(None, "--epsilon", help="Target epsilon: prints the conservative sigma."),
    delta: float = typer.Option(None, "--delta", help="Delta (default: the dataset's delta cap)."),
    dataset: str = typer.Option(None, "--dataset", help="Compose with this dataset's spend so far."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """What-if: epsilon of a DP-SGD run by RDP and PLD (or the sigma for a target epsilon). Changes nothing."""
    if (sigma is None) == (epsilon is None):
        raise InvalidParameterError("Give exactly one of --sigma (to get epsilon) or --epsilon (to get sigma).")
    prior, b = [], None
    if dataset is not None:
        b = ledger.budget(store(), dataset)
        prior = b.history
        if delta is not None and delta > b.dataset.delta_cap:
            raise InvalidParameterError(
                f"--delta {delta:g} is above {b.dataset.name}'s delta cap {b.dataset.delta_cap:g} (which is below "
                f"1/n = {1 / b.dataset.record_count:.3g}): its budget is stated at that delta. Leave --delta out to "
                "use the cap, or give a smaller one.")
        delta = b.dataset.delta_cap if delta is None else delta
    if delta is None:
        raise InvalidParameterError("Give --delta (or --dataset to use its delta cap).")
    if sigma is None:
        sigma = calibrate_dpsgd_sigma(epsilon, delta, sample_rate, steps, prior=prior)
    report = epsilon_report(prior + [DpSgd(sample_rate, sigma, steps)], delta)
    result = {"epsilon_rdp": report.epsilon_rdp, "epsilon_pld": report.epsilon_pld, "sigma": sigma, "delta": delta,
              "sample_rate": sample_rate, "steps": steps, "composed_with": dataset}
    if b is not None:
        result["epsilon_cap"] = b.dataset.epsilon_cap
        after = curve.curve_of(prior + [DpSgd(sample_rate, sigma, steps)])
        fits, result["filter_epsilon"] = privacy_filter.cap_check(after.rdp, b.dataset.epsilon_cap, b.dataset.delta_cap)
        result["fits_cap"] = fits
        result["remaining_after_rdp"] = b.dataset.epsilon_cap - report.epsilon_rdp
    if as_json:
        print_json(result)
        return
    what = f"DP-SGD q={sample_rate:g}, sigma={sigma:.6g}, steps={steps}, delta={delta:g}"
    console.print(f"[bold]{what}[/]" + (f", composed with {dataset}'s spend" if dataset else ""))
    console.print(f"  epsilon RDP (reference): {fmt_eps(report.epsilon_rdp)}")
    console.print(f"  epsilon PLD (tighter):   {fmt_eps(report.epsilon_pld)}")
    if epsilon is not None:
        console.print(f"  conservative sigma for epsilon <= {epsilon:g}: {sigma:.6g}")
    if b is not None:
        ok = result["fits_cap"]
        colour = "green" if ok else "red"
        console.print(f"  [{colour}]{'fits' if ok else 'exceeds'} the cap {b.dataset.epsilon_cap:g}: the cap's privacy "
                      f"filter would be at {result['filter_epsilon']:.4f} (RDP remaining after: "
                      f"{result['remaining_after_rdp']:.4f})[/]")


@app.command("verify")
def verify(as_json: bool = typer.Option(False, "--json")) -> None:
    """The auditor's check: recompute every dataset's RDP curve from its stored events and compare it with the
    running curve the ledger keeps (and charges against). Exit 1 on any difference beyond float error."""
    s = store()
    with s.transaction() as con:
        rows = curve.verify(con)
    if as_json:
        print_json(rows)
    else:
        console.print(table("Running RDP curve vs. recomputed from the stored events",
                            ["dataset", "running eps", "recomputed eps", "max |diff| per order", "agree"],
                            [[r["dataset"], fmt_eps(r["epsilon_rdp_running"]), fmt_eps(r["epsilon_rdp_recomputed"]),
                              "-" if r["max_abs_rdp_difference"] is None else f"{r['max_abs_rdp_difference']:.2e}",
                              "yes" if r["agree"] else "[red]NO[/]"] for r in rows]))
    if not all(r["agree"] for r in rows):
        raise typer.Exit(1)


@ledger_app.command("show")
def ledger_show(dataset: str = typer.Option(None, "--dataset"), as_json: bool = typer.Option(False, "--json")) -> None:
    """Every charge in the ledger, oldest first (optionally one dataset)."""
    pairs = ledger.all_charges(store())
    rows = [{"position": c.position, "dataset": d.name, "run_id": c.run_id, "state": c.state,
             "planned": "; ".join(e.describe() for e in c.planned_events),
             "charged": "; ".join(e.describe() for e in c.charged_events), "actor": c.actor,
             "reserved_at": c.reserved_at, "settled_at": c.settled_at, "description": c.description}
            for d, c in pairs if dataset in (None, d.name, d.dataset_id)]
    if as_json:
        print_json(rows)
        return
    console.print(table("Ledger", ["#", "dataset", "run", "state", "planned", "charged", "actor", "reserved"], [
        [r["position"], r["dataset"], r["run_id"], r["state"], r["planned"], r["charged"] or "-", r["actor"],
         r["reserved_at"][:19]] for r in rows
    ]))
    if not rows:
        console.print("[dim]No charges yet.[/]")
