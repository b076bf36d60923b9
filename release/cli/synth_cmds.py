"""`privrelease synth privimage|ksalsa`: run a mechanism directly (charged to the ledger), outside
the release lifecycle — for experiments by a steward. Output: an .npz of images and labels."""
from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import typer

from accounting import ledger
from release.cli.common import console, default_actor, fmt_eps, store
from release.cli.progress import rich_progress
from release.data import load_registered
from synth.datasets import load_public

app = typer.Typer(help="Run a mechanism directly on a registered dataset (charged to its ledger).",
                  no_args_is_help=True)


def _save(out: Path, result) -> None:
    arrays = {"images": result.images, "labels": result.labels}
    if result.label_distributions is not None:
        arrays["label_distributions"] = result.label_distributions
    np.savez_compressed(out, **arrays)
    console.print(f"[green]{len(result.images)} images[/] -> {out}\n  guarantee: {result.guarantee}")


@app.command("privimage")
def privimage(
    dataset: str = typer.Option(..., "--dataset"),
    public: str = typer.Option("builtin:public-pool", "--public", help="Public labelled pool for the semantic query."),
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon for the dataset's whole history."),
    delta: float = typer.Option(None, "--delta", help="Default: the dataset's delta cap."),
    k: int = typer.Option(3, "--k", help="Top-k public classes per image / per sensitive class."),
    query_sigma: float = typer.Option(20.0, "--query-sigma"),
    n_samples: int = typer.Option(1000, "--n-samples"),
    preset: str = typer.Option("demo", "--preset", help="default | demo | tiny"),
    ddim_steps: int = typer.Option(None, "--ddim-steps"),
    run_id: str = typer.Option(None, "--run-id", help="Resume this run (same id, no double charge)."),
    out: Path = typer.Option(Path("privimage-samples.npz"), "--out"),
    actor: str = typer.Option(None, "--actor"),
) -> None:
    """PrivImage: DP semantic query -> selection -> pretrain -> DP-SGD fine-tune -> DDIM samples."""
    from synth.privimage import PrivImageConfig, run_privimage

    s = store()
    ds, data = load_registered(s, dataset)
    overrides = {"k": k, "query_sigma": query_sigma, "n_samples": n_samples}
    if ddim_steps:
        overrides["ddim_steps"] = ddim_steps
    delta = ds.delta_cap if delta is None else delta
    cfg = PrivImageConfig(epsilon, delta, **overrides) if preset == "default" else \
        getattr(PrivImageConfig, preset)(epsilon, delta, **overrides)
    run_id = run_id or "synth-" + uuid.uuid4().hex[:10]
    console.print(f"run id {run_id} (re-run with --run-id {run_id} to resume)")
    with rich_progress() as progress:
        result = run_privimage(s, ds.name, data, load_public(public, ds.source), cfg, run_id=run_id,
                               workdir=s.workspace.artifacts / run_id, progress=progress, actor=actor or default_actor())
    _save(out, result)
    b = ledger.budget(s, ds.name)
    console.print(f"  {ds.name} spent: RDP {fmt_eps(b.spent.epsilon_rdp)}, PLD {fmt_eps(b.spent.epsilon_pld)} "
                  f"of cap {ds.epsilon_cap:g}")


@app.command("ksalsa")
def ksalsa(
    dataset: str = typer.Option(..., "--dataset"),
    k: int = typer.Option(..., "--k"),
    method: str = typer.Option("ksalsa", "--method", help="ksalsa | centroid | pixel | pca"),
    public: str = typer.Option("builtin:uci-digits", "--public", help="Public set for the latent codec."),
    preset: str = typer.Option("demo", "--preset", help="default | demo | tiny"),
    acknowledge_non_dp: bool = typer.Option(False, "--acknowledge-non-dp",
                                            help="Accept that this release voids the dataset's DP guarantees."),
    run_id: str = typer.Option(None, "--run-id"),
    out: Path = typer.Option(Path("ksalsa-representatives.npz"), "--out"),
    actor: str = typer.Option(None, "--actor"),
) -> None:
    """k-SALSA / k-Same baselines: one averaged representative per cluster of k records."""
    from synth.ksalsa import KSalsaConfig, run_ksalsa

    s = store()
    ds, data = load_registered(s, dataset)
    cfg = KSalsaConfig(k=k, method=method) if preset == "default" else getattr(KSalsaConfig, preset)(k=k, method=method)
    run_id = run_id or "synth-" + uuid.uuid4().hex[:10]
    with rich_progress() as progress:
        result = run_ksalsa(s, ds.name, data, load_public(public, ds.source), cfg, run_id=run_id,
                            workdir=s.workspace.artifacts / run_id, progress=progress,
                            actor=actor or default_actor(), acknowledge_non_dp=acknowledge_non_dp)
    _save(out, result)
