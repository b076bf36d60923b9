"""`privrelease dataset register|list|show`."""

from __future__ import annotations

import typer
from rich.markup import escape

from accounting import ledger
from release.cli.common import acting, console, print_json, store, table
from release.data import register_from_source

app = typer.Typer(help="Register and inspect sensitive datasets.", no_args_is_help=True)


@app.command("register")
def register(
    name: str = typer.Argument(..., help="Name for the dataset (letters, digits, - _ .)."),
    source: str = typer.Option(
        ...,
        "--source",
        help="builtin:mnist5k, builtin:fashion-mnist, a folder of class "
        "subfolders, .parquet or .npz; head MRI: a folder of NIfTI files, bids:DIR (a BIDS "
        "dataset) or dicom:DIR (a DICOM study).",
    ),
    labels: str = typer.Option(
        None,
        "--labels",
        help="The label set (public): values like 0-9 or 0,1,2,5 for "
        ".npz/Parquet, the class subfolder names (cat,dog) "
        "for a folder; built-ins declare their own.",
    ),
    epsilon: float = typer.Option(
        ..., "--epsilon", help="Budget cap epsilon for all releases of this dataset."
    ),
    delta: float = typer.Option(..., "--delta", help="Budget cap delta (well below 1/n)."),
    privacy_unit: str = typer.Option(
        "one image", "--privacy-unit", help="What one record is (e.g. 'one patient')."
    ),
    actor: str = typer.Option(
        None,
        "--as",
        help="The steward registering it (needs their private key; default $PRIVRELEASE_ACTOR).",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Register a dataset with its privacy budget; the data stays where it is, the store keeps its
    HMAC."""
    steward = acting(actor, "steward")
    ds, created = register_from_source(
        store(),
        name,
        source,
        epsilon,
        delta,
        labels=labels,
        privacy_unit=privacy_unit,
        actor=steward.name,
    )
    if as_json:
        print_json({"created": created, **ds.__dict__})
        return
    verb = "Registered" if created else "Already registered (same content)"
    console.print(
        f"[green]{verb}[/] {ds.name} ({ds.dataset_id}): {ds.record_count} records, labels "
        f"{ds.labels}, cap epsilon={ds.epsilon_cap:g}, delta={ds.delta_cap:g}"
    )


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json")) -> None:
    """List registered datasets."""
    datasets = ledger.list_datasets(store())
    if as_json:
        print_json([d.__dict__ for d in datasets])
        return
    rows = [
        [
            d.name,
            d.dataset_id,
            d.record_count,
            "x".join(map(str, d.image_shape)),
            len(d.labels),
            f"{d.epsilon_cap:g}",
            f"{d.delta_cap:g}",
            escape(d.source),
        ]
        for d in datasets
    ]
    console.print(
        table(
            "Datasets",
            ["name", "id", "records", "shape", "classes", "eps cap", "delta cap", "source"],
            rows,
        )
    )


@app.command("show")
def show(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one dataset's registration record."""
    d = ledger.get_dataset(store(), name)
    if as_json:
        print_json(d.__dict__)
        return
    rows = [[k, escape(str(v))] for k, v in d.__dict__.items()]
    console.print(table(f"Dataset {d.name}", ["field", "value"], rows))
    console.print(
        "[dim]fingerprint = HMAC-SHA256 under the workspace "
        "key (a plain hash would leak membership).[/]"
    )
