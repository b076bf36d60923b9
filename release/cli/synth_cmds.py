"""`privrelease synth privimage|ksalsa|merf`: preview what a mechanism run would cost, without
reading the sensitive data or spending budget. Running goes through the release lifecycle (plan ->
steward approval -> run): `--write-spec` writes the spec to plan with `privrelease release plan`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
import typer
from rich.markup import escape

from accounting import ledger
from accounting.errors import DataFormatError
from release import planning
from release.cli.common import console, fmt_eps, store
from release.spec import ReleaseSpec
from release.terminal import print_choices, rich_progress
from synth.kinds.datasets import heldout_source

app = typer.Typer(
    help="Preview a mechanism on a registered dataset: events and epsilon, nothing read or "
    "charged. To run it, write the spec (--write-spec FILE), "
    "then `privrelease release plan FILE` and approve it.",
    no_args_is_help=True,
)
WRITE = typer.Option(
    None, "--write-spec", help="Also write the spec as TOML, for `privrelease release plan`."
)
HELDOUT = typer.Option(
    None,
    "--heldout",
    help="Real held-out images of the same distribution, not in the registered "
    "set (folder, .parquet, .npz): the audit's attacks and utility gate need them for user data. "
    "Default: the built-in dataset's own held-out split.",
)


def _with_heldout(spec: dict[str, Any], heldout: str | None) -> dict[str, Any]:
    """The spec with `heldout` in [release]: the given source, else a built-in dataset's own split
    (written out, so the spec says what the audit will use)."""
    if heldout is None:
        ds = ledger.get_dataset(store(), spec["release"]["dataset"])
        heldout = heldout_source(ds.source)
    if heldout is not None:
        if not heldout.startswith("builtin:") and not Path(heldout).exists():
            raise DataFormatError(
                f"--heldout {heldout}: no such file or folder; give real held-out images (folder, "
                ".parquet or .npz) of the registered data's format."
            )
        local = not heldout.startswith("builtin:")
        # plan from anywhere
        spec["release"]["heldout"] = str(Path(heldout).resolve()) if local else heldout
    return spec


def _number_or_auto(
    text: str, parse: Callable[[str], float | int], option: str, wanted: str, example: str
) -> float | int | str:
    """A value given on the command line: "auto" or what `parse` reads (the config checks its
    range); otherwise an error naming `wanted` and an `example`."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return parse(text)
    except ValueError:
        raise typer.BadParameter(
            f'{text!r} is not {wanted} or "auto"; give e.g. {example}.', param_hint=option
        ) from None


def _preview(spec: dict[str, Any], write_spec: Path | None) -> None:
    with rich_progress() as progress:
        pv = planning.preview(store(), ReleaseSpec.from_dict(spec), progress)
    b, a = pv["epsilon_before"], pv["epsilon_after"]
    console.print(
        f"[bold]Preview[/] (nothing was read or charged): {spec['release']['mechanism']} on "
        f"{spec['release']['dataset']}"
    )
    console.print(f"  events: {'; '.join(pv['events_described'])}")
    console.print(
        f"  epsilon before: RDP {fmt_eps(b['epsilon_rdp'])}  PLD {fmt_eps(b['epsilon_pld'])}"
    )
    console.print(
        f"  epsilon after:  RDP {fmt_eps(a['epsilon_rdp'])}  PLD {fmt_eps(a['epsilon_pld'])}"
    )
    console.print(f"  images: {pv['expected_count']}")
    print_choices(pv["choices"])
    for w in pv["warnings"]:
        console.print(f"  [yellow]warning:[/] {escape(w)}")
    if "heldout" not in spec["release"]:
        console.print(
            "  [yellow]warning:[/] no held-out data: the audit's attacks and utility gate need "
            "real held-out images of this dataset (not in the registered set); add --heldout PATH "
            "(a folder, Parquet or .npz file), or the audit will refuse the release."
        )
    if write_spec is not None:
        write_spec.write_text(tomli_w.dumps(spec))
        console.print(
            f"Spec written to {write_spec}. To run it: privrelease release plan {write_spec}, then "
            "approve it as a steward and `privrelease release run`."
        )
    else:
        console.print(
            "To run it: add --write-spec FILE, then `privrelease "
            "release plan FILE` and a steward's approval."
        )


_VOTE_SIGMA = typer.Option(
    None,
    "--vote-sigma",
    help="Noise multiplier of the private vote on the samples (0 = off; default: the preset's).",
)

_VOTE_ROUNDS = typer.Option(
    None,
    "--vote-rounds",
    help="Rounds of the private vote; each later round votes on variations of the "
    "previous winners and is charged as one more Gaussian query (default: the preset's).",
)

_RELEASE_VARIATIONS = typer.Option(
    None,
    "--release-variations",
    help="Light variations released beside each voted image (post-processing, "
    "no budget; default: the preset's).",
)

_PRECISION = typer.Option(
    None,
    "--precision",
    help="UNet compute precision: auto (bfloat16 where the hardware runs it natively, "
    "else float32) | float32 | bfloat16. Changes speed, not the guarantee (default: auto).",
)


@app.command("privimage")
def privimage(
    dataset: str = typer.Option(..., "--dataset"),
    public: str = typer.Option(
        "builtin:public-pool", "--public", help="Public labelled pool for the semantic query."
    ),
    epsilon: float = typer.Option(
        ..., "--epsilon", help="Target epsilon for the dataset's whole history."
    ),
    delta: float = typer.Option(None, "--delta", help="Default: the dataset's delta cap."),
    k: int = typer.Option(3, "--k", help="Top-k public classes per image / per sensitive class."),
    query_sigma: float = typer.Option(
        10.0, "--query-sigma", help="Noise multiplier of the DP semantic query."
    ),
    n_samples: int = typer.Option(1000, "--n-samples"),
    vote_sigma: float = _VOTE_SIGMA,
    vote_rounds: int = _VOTE_ROUNDS,
    release_variations: int = _RELEASE_VARIATIONS,
    precision: str = _PRECISION,
    preset: str = typer.Option("demo", "--preset", help="default | demo | tiny"),
    heldout: str = HELDOUT,
    write_spec: Path = WRITE,
) -> None:
    """PrivImage: DP semantic query -> selection -> pretrain -> DP-SGD fine-tune -> DDIM samples
    (preview)."""
    params = {
        "public": public,
        "epsilon": epsilon,
        "k": k,
        "query_sigma": query_sigma,
        "preset": preset,
    }
    optional = {
        "delta": delta,
        "vote_sigma": vote_sigma,
        "vote_rounds": vote_rounds,
        "release_variations": release_variations,
        "precision": precision,
    }
    params.update({key: value for key, value in optional.items() if value is not None})
    _preview(
        _with_heldout(
            {
                "release": {"dataset": dataset, "mechanism": "privimage", "n_images": n_samples},
                "privimage": params,
            },
            heldout,
        ),
        write_spec,
    )


@app.command("ksalsa")
def ksalsa(
    dataset: str = typer.Option(..., "--dataset"),
    k: int = typer.Option(..., "--k"),
    method: str = typer.Option("ksalsa", "--method", help="ksalsa | centroid | pixel | pca"),
    public: str = typer.Option(
        "builtin:uci-digits", "--public", help="Public set for the latent codec."
    ),
    preset: str = typer.Option("demo", "--preset", help="default | demo | tiny"),
    heldout: str = HELDOUT,
    write_spec: Path = WRITE,
) -> None:
    """k-SALSA / k-Same baselines: one averaged representative per cluster of k records
    (preview)."""
    _preview(
        _with_heldout(
            {
                "release": {"dataset": dataset, "mechanism": "ksalsa"},
                "ksalsa": {"k": k, "method": method, "public": public, "preset": preset},
            },
            heldout,
        ),
        write_spec,
    )


@app.command("merf")
def merf(
    dataset: str = typer.Option(..., "--dataset"),
    epsilon: float = typer.Option(
        ..., "--epsilon", help="Target epsilon for the dataset's whole history."
    ),
    n_samples: int = typer.Option(10_000, "--n-samples", help="Images to release."),
    steps: str | None = typer.Option(
        None,
        "--steps",
        help='Generator updates (no privacy cost), or "auto" (default: decided by the plan, 4000 '
        "where the summary is precise, else 2000).",
        show_default=False,
    ),
    teacher_labels: bool | None = typer.Option(
        None,
        "--teacher-labels/--no-teacher-labels",
        help="Label the images with a classifier trained with DP-SGD on the sensitive images (a "
        "second charged event, see docs/merf.md). Default: decided by the plan, on where the "
        "classes are large enough for the summary to keep its detail at half the budget.",
        show_default=False,
    ),
    perceptual_share: str | None = typer.Option(
        None,
        "--perceptual-share",
        help="Share of each image's summary given to features of a public pretrained network: 0 "
        '(pixels only, 3x faster training), up to 0.9, or "auto" (default: decided by the plan, '
        "on where the classes are large enough for the pixels to keep their detail beside them).",
        show_default=False,
    ),
    heldout: str = HELDOUT,
    write_spec: Path = WRITE,
) -> None:
    """DP-MERF: one noisy random-feature summary of each class and a small generator trained on
    it; minutes on a laptop, the baseline a PrivImage release should beat (preview)."""
    settings: dict[str, Any] = {"epsilon": epsilon}
    if steps is not None:
        settings["steps"] = _number_or_auto(steps, int, "--steps", "a whole number", "4000")
    if teacher_labels is not None:
        settings["teacher_labels"] = teacher_labels
    if perceptual_share is not None:
        settings["perceptual_share"] = _number_or_auto(
            perceptual_share, float, "--perceptual-share", "a number", "0.5, or 0 for pixels only"
        )
    _preview(
        _with_heldout(
            {
                "release": {"dataset": dataset, "mechanism": "merf", "n_images": n_samples},
                "merf": settings,
            },
            heldout,
        ),
        write_spec,
    )
