"""PrivImage on Fashion-MNIST at CPU scale: DPImageBench's data protocol (60,000 sensitive training
images, the
10,000 test images for the classifiers), `make reproduce`'s CPU recipe, public = UCI digits (the only built-in
public source disjoint from Fashion-MNIST). One charged run per epsilon through the product (`run_direct`), plus
the classifiers trained on real Fashion-MNIST for reference. Needs the Debian package
dataset-fashion-mnist.

    python -m benchmarks.fashion_cpu [--epsilons 10,1] [--real] [--set central_images=2 --set selection=procedural]
                                     [--label NAME] [--train-subset N] [--dataset mnist5k]

`--set key=value` overrides one PrivImageConfig field of the recipe (the value read as JSON, else as a string);
`--train-subset N` takes N sensitive images (balanced, seeded) for a reduced ablation, labelled as such in the row.

`--dataset mnist5k` runs the same recipe on MNIST-5k (4,000 sensitive digits, its 1,000 held-out digits for the
classifiers, the default public pool): the check that a change of prior costs nothing where public
data fits.

Writes one JSON line per run to benchmarks/results/fashion-cpu.jsonl (MNIST-5k: mnist5k-cpu.jsonl) and a sample
grid PNG per run beside it.
Hours on 2 CPU cores (960 DP-SGD steps per run at batch 250); the GPU preset is the paper-sized version.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import dpimagebench
from benchmarks.common import machine, throwaway_store, today
from benchmarks.reproduce_plots import image_grid
from benchmarks.reproduce_privimage import _accuracies
from benchmarks.reproduce_settings import privimage_config, settings

RESULTS = Path(__file__).resolve().parent / "results"


DATASETS = {
    # name: (sensitive source, test source, results file, title)
    "fashion": (
        "builtin:fashion-mnist",
        "builtin:fashion-mnist-test",
        "fashion-cpu",
        "Fashion-MNIST",
    ),
    "mnist5k": ("builtin:mnist5k", "builtin:mnist5k-heldout", "mnist5k-cpu", "MNIST-5k"),
}


def _record(row: dict, dataset: str = "fashion") -> None:
    RESULTS.mkdir(exist_ok=True)
    with (RESULTS / f"{DATASETS[dataset][2]}.jsonl").open("a") as f:
        f.write(json.dumps({**row, "date": today(), "machine": machine()}, default=str) + "\n")
    print(json.dumps(row, default=str), flush=True)


def parse_overrides(
    parser: argparse.ArgumentParser, pairs: list[str], mechanism: str = "privimage"
) -> dict:
    """`key=value` pairs, each key a field of the mechanism's config (checked before any data is
    loaded): the value as JSON where it parses (numbers, true/false, lists), else the string."""
    from dataclasses import fields

    from synth import registry

    known = sorted(f.name for f in fields(registry.get(mechanism).config_type))
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            parser.error(f"--set {pair!r}: give KEY=VALUE with KEY one of {known}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def run_epsilon(
    epsilon: float,
    s: dict,
    sens,
    test,
    pub,
    tmp: Path,
    overrides: dict | None = None,
    label: str = "",
    dataset: str = "fashion",
    mechanism: str = "privimage",
    protocol: str = "ours",
) -> None:
    from release.runner import run_direct
    from synth.mechanisms.merf import MerfConfig

    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in (overrides or {}).items()}
    tag = f"{dataset}-{mechanism}-eps{epsilon:g}{'-' + label if label else ''}-{int(time.time())}"
    store = throwaway_store(tmp / tag / "ws", dataset, sens, epsilon, s["delta"])
    started = time.time()
    n_samples = {"n_samples": dpimagebench.GENERATED} if protocol == "dpimagebench" else {}
    config = (
        privimage_config(s, epsilon).with_(**{**n_samples, **overrides})
        if mechanism == "privimage"
        else MerfConfig.create(epsilon, s["delta"]).with_(**{**n_samples, **overrides})
    )
    res = run_direct(
        store, dataset, sens, pub, mechanism, config, run_id=tag, workdir=tmp / tag / "run"
    )
    seconds = round(time.time() - started)
    acc = _accuracies(res.images, res.labels, test, s["cnn_epochs"], s["seed"])
    title = f"{mechanism} {DATASETS[dataset][3]} eps {epsilon:g} {label}".strip()
    grid = image_grid(RESULTS / f"{tag}_grid.png", res.images, res.labels, title, per_class=8)
    scored = None
    if protocol == "dpimagebench":
        np.savez_compressed(RESULTS / f"{tag}.npz", images=res.images, labels=res.labels)
        val, test_set = dpimagebench.protocol_sets(*DATASETS[dataset][:2])
        scored = dpimagebench.score(res.images, res.labels, val, test_set, epsilon).as_dict()
    p = res.parameters
    _record(
        {
            "epsilon": epsilon,
            "label": label or None,
            "overrides": overrides,
            "n_sensitive": len(sens.labels),
            "fitted": p.get("fitted_classes"),
            "fallback": p.get("fallback_classes"),
            "mechanism": mechanism,
            "protocol": protocol,
            "delta": s["delta"],
            "steps": p.get("steps"),
            "sigma": p.get("noise_multiplier", p.get("sigma")),
            "selected": p.get("selected_public_classes"),
            "frequency_warmup": p.get("frequency_warmup"),
            "central_images": p.get("central_images"),
            "generator_attempts": p.get("generator_attempts"),
            "collapsed_classes": p.get("collapsed_classes"),
            "teacher_labels": p.get("teacher_labels"),
            "teacher_label_agreement": p.get("teacher_label_agreement"),
            "perceptual_share": p.get("perceptual_share"),
            "seconds": seconds,
            "acc": acc,
            "protocol_score": scored,
            "n_released": len(res.images),
            "timings": res.internal.get("timings_s"),
            "grid": grid,
            **({"dataset": dataset} if dataset != "fashion" else {}),
        },
        dataset,
    )


def run_real(s: dict, sens, test, dataset: str = "fashion") -> None:
    rng = np.random.default_rng(s["seed"])
    for n in sorted({min(4000, len(sens.labels)), len(sens.labels)}):
        idx = np.sort(rng.permutation(len(sens.labels))[:n])
        _record(
            {
                "real_train_images": n,
                "acc": _accuracies(
                    sens.images[idx], sens.labels[idx], test, s["cnn_epochs"], s["seed"]
                ),
            },
            dataset,
        )


def main() -> None:
    from synth.kinds.datasets import load_source, public_pool

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epsilons", default="10,1")
    parser.add_argument(
        "--real", action="store_true", help="also the classifiers trained on real Fashion-MNIST"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one PrivImageConfig field of the recipe (repeatable)",
    )
    parser.add_argument("--label", default="", help="a name for the rows and grids of this variant")
    parser.add_argument(
        "--train-subset", type=int, default=0, help="reduced ablation: N sensitive images"
    )
    parser.add_argument("--mechanism", choices=("privimage", "merf"), default="privimage")
    parser.add_argument(
        "--protocol",
        choices=("ours", "dpimagebench"),
        default="ours",
        help="dpimagebench: its 55,000 / 5,000 split, delta 1 / (N ln N), 60,000 released images "
        "and its score (benchmarks.dpimagebench, CPU classifier) beside the old one",
    )
    parser.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        default="fashion",
        help="fashion: public = UCI digits (does not fit); mnist5k: the default pool (fits)",
    )
    args = parser.parse_args()
    overrides = parse_overrides(parser, args.set, args.mechanism)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    s = settings("cpu")
    sens_source, test_source = DATASETS[args.dataset][:2]
    sens, test = load_source(sens_source), load_source(test_source)
    pub = public_pool(include_fashion=False) if args.dataset == "fashion" else public_pool()
    if args.protocol == "dpimagebench":
        if args.dataset != "fashion":
            parser.error(
                "--protocol dpimagebench splits a 60,000-image training set: --dataset fashion"
            )
        private, _ = dpimagebench.split_indices(len(sens))
        sens = sens.subset(np.sort(private))
        s["delta"] = dpimagebench.protocol_delta(len(sens))
    if args.train_subset:
        idx = np.random.default_rng(s["seed"]).permutation(len(sens.labels))[: args.train_subset]
        sens = sens.subset(np.sort(idx))
    with tempfile.TemporaryDirectory() as tmp:
        for eps in [float(e) for e in args.epsilons.split(",") if e]:
            run_epsilon(
                eps,
                s,
                sens,
                test,
                pub,
                Path(tmp),
                overrides,
                args.label,
                args.dataset,
                args.mechanism,
                args.protocol,
            )
    if args.real:
        run_real(s, sens, test, args.dataset)


if __name__ == "__main__":
    main()
