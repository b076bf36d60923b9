"""The issue's GPU preset, sized for minutes on one GPU: PrivImage through the product
(`run_direct`, one charged
run per line) on Fashion-MNIST (60,000 sensitive training images, DPImageBench's protocol; public = UCI digits,
the built-in source disjoint from it) and MNIST-5k (4,000; public = UCI digits + Fashion-MNIST), with
`make reproduce --full`'s recipe (benchmarks/reproduce_settings.py, "full").

    python -m benchmarks.gpu_preset --out DIR [--runs mnist5k:10,fashion:10,fashion:1] [--mode full|cpu|micro]
                                    [--set KEY=JSON ...] [--score] [--protocol dpimagebench
                                    --score-with cpu-cnn,wrn]

A run `source:epsilon:merf` makes a DP-MERF release (the merf mechanism's defaults) instead of PrivImage's.

Each run writes to DIR: a JSON line in gpu-preset.jsonl (epsilon, sigma, steps, stage timings, machine) and the
released images and labels (`<tag>.npz`). Scoring them (the audit's LR / MLP / CNN trained on the release,
tested on the real held-out set) is CPU work, so it can run where the images are copied to:
`--score` scores
every npz in DIR that has no score yet, appends the accuracies to gpu-preset.jsonl and draws each run's grid.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch

from benchmarks import dpimagebench
from benchmarks.common import machine, throwaway_store, today
from benchmarks.reproduce_settings import VOTE_KEYS, privimage_config, settings
from synth.mechanisms.privimage import PrivImageConfig

MECHANISMS = ("privimage", "merf")
SOURCES = {
    "mnist5k": ("builtin:mnist5k", "builtin:mnist5k-heldout", True),
    "fashion": ("builtin:fashion-mnist", "builtin:fashion-mnist-test", False),
}
LOG = "gpu-preset.jsonl"


def _record(out: Path, row: dict) -> None:
    with (out / LOG).open("a") as f:
        f.write(json.dumps({**row, "date": today(), "machine": machine()}, default=str) + "\n")
    print(json.dumps(row, default=str), flush=True)


def run_one(
    name: str,
    epsilon: float,
    s: dict,
    out: Path,
    tmp: Path,
    protocol: str = "ours",
    score_with: tuple[str, ...] = (),
    mechanism: str = "privimage",
    score_epochs: int = dpimagebench.EPOCHS,
    score_precision: str = "float32",
) -> None:
    """One charged release of source `name` at `epsilon` by `mechanism` (PrivImage with the mode's
    recipe, or DP-MERF with its defaults); its images saved for scoring. On DPImageBench's protocol the
    generator sees its 55,000-image private split, delta is 1 / (N ln N) and 60,000 images are
    released (benchmarks.dpimagebench), then scored here by each of `score_with` in turn."""
    from release.runner import run_direct
    from synth.kinds.datasets import load_source, public_pool
    from synth.mechanisms.merf import MerfConfig

    source, _, with_fashion = SOURCES[name]
    sens, pub = load_source(source), public_pool(include_fashion=with_fashion)
    s = {**s, "privimage": dict(s["privimage"])}
    if protocol == "dpimagebench":
        private, _ = dpimagebench.split_indices(len(sens))
        sens = sens.subset(np.sort(private))
        s["delta"] = dpimagebench.protocol_delta(len(sens))
        s["privimage"]["n_samples"] = dpimagebench.GENERATED
    kind = "" if mechanism == "privimage" else f"-{mechanism}"
    tag = f"{name}{kind}-eps{epsilon:g}-{protocol}-{int(time.time())}"
    store = throwaway_store(tmp / tag / "ws", name, sens, epsilon, s["delta"])
    # after the store: a bad epsilon is refused there, with the planner's message
    config = (
        privimage_config(s, epsilon)
        if mechanism == "privimage"
        else MerfConfig.create(
            epsilon, s["delta"], n_samples=s["privimage"].get("n_samples", MerfConfig.n_samples)
        )
    )
    started = time.time()
    res = run_direct(
        store,
        name,
        sens,
        pub,
        mechanism,
        config,
        run_id=tag,
        workdir=tmp / tag / "run",
    )
    np.savez_compressed(out / f"{tag}.npz", images=res.images, labels=res.labels)
    p = res.parameters
    _record(
        out,
        {
            "tag": tag,
            "dataset": name,
            "n_sensitive": len(sens),
            "epsilon": epsilon,
            "delta": s["delta"],
            "protocol": protocol,
            "mechanism": mechanism,
            "steps": p.get("steps"),
            "sigma": p.get("noise_multiplier", p.get("sigma")),
            "bandwidth": p.get("bandwidth"),
            "frequency_warmup": p.get("frequency_warmup"),
            "selected": p.get("selected_public_classes"),
            "seconds": round(time.time() - started, 1),
            "n_released": len(res.images),
            "timings": res.internal.get("timings_s"),
            "device": _device(),
            "recipe": s["privimage"] | s["vote"][f"{epsilon:g}"]
            if mechanism == "privimage"
            else asdict(config),
        },
    )
    if protocol == "dpimagebench" and score_with:  # on this machine (a GPU: DPImageBench's WRN)
        sets = dpimagebench.protocol_sets(*SOURCES[name][:2])  # read once for every classifier
        for classifier in score_with:
            protocol_score(
                out,
                tag,
                name,
                epsilon,
                res.images,
                res.labels,
                classifier,
                _device(),
                score_epochs,
                sets,
                precision=score_precision,
            )


def protocol_score(
    out: Path,
    tag: str,
    name: str,
    epsilon: float,
    images: np.ndarray,
    labels: np.ndarray,
    classifier: str,
    where: str,
    epochs: int = dpimagebench.EPOCHS,
    sets: tuple[tuple, tuple] | None = None,
    precision: str = "float32",
) -> dict:
    """DPImageBench's score of one release (benchmarks.dpimagebench.score), appended to the log;
    `sets`: the protocol's (validation, test) sets of `name` where the caller has read them already."""
    val, test = sets if sets is not None else dpimagebench.protocol_sets(*SOURCES[name][:2])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = dpimagebench.score(
        images,
        labels,
        val,
        test,
        epsilon,
        classifier=classifier,
        device=device,
        epochs=epochs,
        precision=precision,
    )
    row = {
        "tag": tag,
        "dataset": name,
        "epsilon": epsilon,
        "protocol_score": result.as_dict(),
        "scored_on": where,
    }
    _record(out, row)
    return row


def fit_releases(out: Path, mib: float) -> None:
    """Keep the saved releases within `mib` MiB (what a GPU lease can bring back): whole ones in run
    order while they fit, then a balanced 600-per-class part of each of the rest (`<tag>.npz` is
    then that part; its log row says how many images it kept)."""
    budget = mib * 2**20
    for path in sorted(out.glob("*.npz"), key=lambda p: p.stat().st_mtime):
        size = path.stat().st_size
        if size <= budget:
            budget -= size
            continue
        with np.load(path) as data:
            images, labels = data["images"], data["labels"]
        keep = dpimagebench.balanced_subset(labels, 600)
        np.savez_compressed(path, images=images[keep], labels=labels[keep])
        budget -= path.stat().st_size
        _record(out, {"tag": path.stem, "kept_images": len(keep), "of": len(images)})


def score(out: Path, s: dict, classifier: str = "cpu-cnn") -> None:
    """Accuracies of the classifiers trained on each unscored release in `out` (the audit's LR / MLP
    / CNN on 10,000 of its images, the old scorer), its grid, and for a release made on
    DPImageBench's protocol with all its images back, the protocol's score with `classifier`."""
    from benchmarks.reproduce_plots import image_grid
    from benchmarks.reproduce_privimage import _accuracies
    from synth.kinds.datasets import load_source

    rows = [json.loads(line) for line in (out / LOG).read_text().splitlines() if line.strip()]
    scored = {r["tag"] for r in rows if "acc" in r}
    tests: dict[str, object] = {}  # held-out set per dataset, loaded once
    for r in rows:  # run rows (an error row has no tag, a score row has "acc")
        if (
            "tag" not in r
            or "acc" in r
            or r["tag"] in scored
            or not (out / f"{r['tag']}.npz").exists()
        ):
            continue
        data = np.load(out / f"{r['tag']}.npz")
        if r["dataset"] not in tests:
            tests[r["dataset"]] = load_source(SOURCES[r["dataset"]][1])
        test = tests[r["dataset"]]
        acc = _accuracies(data["images"], data["labels"], test, s["cnn_epochs"], s["seed"])
        grid = image_grid(
            out / f"{r['tag']}_grid.png",
            data["images"],
            data["labels"],
            f"{r.get('mechanism', 'privimage')} {r['dataset']} eps {r['epsilon']:g} ({r['device']})",
            per_class=8,
        )
        _record(
            out,
            {
                "tag": r["tag"],
                "dataset": r["dataset"],
                "epsilon": r["epsilon"],
                "acc": acc,
                "grid": grid,
                "scored_on": "this machine's CPU",
            },
        )
        scored.add(r["tag"])
        if r.get("protocol") == "dpimagebench" and len(data["labels"]) >= dpimagebench.GENERATED:
            protocol_score(
                out,
                r["tag"],
                r["dataset"],
                r["epsilon"],
                data["images"],
                data["labels"],
                classifier,
                "this machine's CPU",
            )


def _device() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _run_spec(parser: argparse.ArgumentParser, text: str) -> tuple[str, float, str]:
    """ "source:epsilon[:mechanism]" -> (source, epsilon, mechanism); the epsilon itself is checked
    by the
    planner (a clear error row)."""
    name, _, rest = text.partition(":")
    eps, _, mechanism = rest.partition(":")
    if name not in SOURCES:
        parser.error(f"--runs {text!r}: unknown source {name!r}; choose from {sorted(SOURCES)}")
    if mechanism not in ("", *MECHANISMS):
        parser.error(f"--runs {text!r}: unknown mechanism {mechanism!r}; choose from {MECHANISMS}")
    try:
        return name, float(eps), mechanism or "privimage"
    except ValueError:
        parser.error(
            f"--runs {text!r}: give source:epsilon[:mechanism], e.g. {name}:10 or {name}:1:merf"
        )


def _classifiers(parser: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """--score-with's comma-separated classifiers, in the order they score."""
    names = tuple(c for c in text.split(",") if c)
    unknown = [c for c in names if c not in dpimagebench.CLASSIFIERS]
    if unknown:
        parser.error(
            f"--score-with {text!r}: unknown classifier {unknown[0]!r}; choose from "
            f"{sorted(dpimagebench.CLASSIFIERS)}, comma-separated"
        )
    return names


def apply_sets(parser: argparse.ArgumentParser, s: dict, items: list[str]) -> None:
    """`--set KEY=VALUE` items into the mode's recipe `s`: VALUE is JSON (a number, true/false, [32,
    64, 64]) or a
    bare word taken as text (vote_space=embedding); vote settings go into every epsilon's vote."""
    fixed = {
        "epsilon",
        "delta",
        "seed",
        "selection",
        "device",
        "query_sigma",
    }  # set per run or by the mode
    types = {f.name: str(f.type) for f in fields(PrivImageConfig) if f.name not in fixed}
    for item in items:
        key, _, value = item.partition("=")
        if key not in types or not value:
            parser.error(f"--set {item!r}: give KEY=VALUE with KEY one of {sorted(types)}")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            if types[key] != "str" or not value.replace("_", "").replace("-", "").isalnum():
                parser.error(
                    f"--set {item!r}: the value must be JSON (a number, true/false, [32, 64, 64], "
                    '"text"; a text setting also takes a bare word, e.g. vote_space=embedding)'
                )
            parsed = value
        for recipe in (
            s["vote"].values() if key in VOTE_KEYS else [s["privimage"]]
        ):  # the vote is set per epsilon
            recipe[key] = parsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--runs",
        default="mnist5k:10,fashion:10,fashion:1",
        help="source:epsilon[:mechanism], comma-separated (mechanism privimage, the default, or merf)",
    )
    parser.add_argument(
        "--score", action="store_true", help="score the saved releases in --out (CPU)"
    )
    parser.add_argument(
        "--mode",
        default="full",
        choices=("full", "cpu", "micro"),
        help="the recipe: full (GPU, default), cpu (make reproduce's), micro (a smoke run)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override one recipe setting for an ablation, e.g. --set batch_size=500",
    )
    parser.add_argument(
        "--score-with",
        default="",
        help="with --protocol dpimagebench: score each release on this machine right after it, by "
        f"each of these classifiers in turn (comma-separated: {', '.join(sorted(dpimagebench.CLASSIFIERS))}; "
        "wrn on a GPU)",
    )
    parser.add_argument(
        "--score-epochs",
        type=int,
        default=dpimagebench.EPOCHS,
        help="the protocol classifier's epochs (50, the protocol's; fewer only for a smoke run)",
    )
    parser.add_argument(
        "--score-precision",
        choices=dpimagebench.PRECISIONS,
        default="float32",
        help="the protocol classifier's precision (float32, the protocol's; bfloat16 autocast for a "
        "short lease)",
    )
    parser.add_argument(
        "--fit-mib",
        type=float,
        help="only shrink the saved releases in --out to this many MiB (what a lease brings back)",
    )
    parser.add_argument(
        "--protocol",
        default="ours",
        choices=("ours", "dpimagebench"),
        help="ours: all training images private, delta 1e-5; dpimagebench: its 55,000 / 5,000 split, "
        "delta 1 / (N ln N), 60,000 released images",
    )
    args = parser.parse_args()
    s = settings(args.mode)
    apply_sets(parser, s, args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fit_mib is not None:
        fit_releases(args.out, args.fit_mib)
        return
    if args.score:
        if not (args.out / LOG).exists():
            parser.error(
                f"nothing to score: {args.out / LOG} does not exist (run the preset with --out there first)"
            )
        torch.set_num_threads(min(2, torch.get_num_threads()))
        score(args.out, s)
        return
    runs = [_run_spec(parser, r) for r in args.runs.split(",") if r]
    score_with = _classifiers(parser, args.score_with)
    with tempfile.TemporaryDirectory(prefix="privrelease-gpu-preset-") as tmp:
        for name, eps, mechanism in runs:
            try:
                run_one(
                    name,
                    eps,
                    s,
                    args.out,
                    Path(tmp),
                    args.protocol,
                    score_with,
                    mechanism,
                    args.score_epochs,
                    args.score_precision,
                )
            except Exception as exc:  # keep the other runs; say what failed
                _record(
                    args.out,
                    {"dataset": name, "epsilon": eps, "error": f"{type(exc).__name__}: {exc}"},
                )


if __name__ == "__main__":
    main()
