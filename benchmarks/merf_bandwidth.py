"""DP-MERF's kernel bandwidth (and other generator settings) on Fashion-MNIST, quickly scored.

    python -m benchmarks.merf_bandwidth --variants '[{"bandwidth": 105}, {"bandwidth": 10}]'

DPImageBench's split and delta (55,000 sensitive images), one noisy embedding per variant at the
planned sigma, the generator trained against it, and a proxy of the protocol's score: the CPU
classifier trained 8 epochs (not 50) on 20,000 generated images (not 55,000), the epoch picked by
noisy validation accuracy. A proxy, for comparing settings with each other in minutes; the
protocol's own score comes from `benchmarks.fashion_cpu --protocol dpimagebench`. One JSON line
per variant in benchmarks/results/merf-bandwidth.jsonl."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from benchmarks import dpimagebench
from benchmarks.common import machine, today
from synth.mechanisms.merf.config import MerfConfig
from synth.tools.kernel.fit import MerfSettings

RESULTS = Path(__file__).resolve().parent / "results" / "merf-bandwidth.jsonl"
# the merf mechanism's defaults, with the old fixed kernel (105 per 784 pixels) as the baseline and
# pixel features alone (as these rows were measured; the config's "auto" share is the plan's call)
FIXED = {"bandwidth": 105.0, "perceptual_share": 0.0}
BASE = {
    **{f.name: getattr(MerfConfig, f.name) for f in fields(MerfSettings) if f.name not in FIXED},
    **FIXED,
}


def main() -> None:
    from accounting.calibration import calibrate_gaussian_sigma
    from synth.kinds.datasets import load_source
    from synth.tools.kernel.fit import fit

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", required=True, help="JSON list of MerfSettings overrides")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--n-generated", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    variants = json.loads(args.variants)
    for variant in variants:  # refused before any data is read
        unknown = set(variant) - set(BASE)
        if unknown:
            parser.error(f"unknown settings {sorted(unknown)}; known: {sorted(BASE)}")
    torch.set_num_threads(1)
    train = load_source("builtin:fashion-mnist")
    private, _ = dpimagebench.split_indices(len(train))
    x, y = train.images[private], train.labels[private]
    val, test = dpimagebench.protocol_sets("builtin:fashion-mnist", "builtin:fashion-mnist-test")
    sigma = calibrate_gaussian_sigma(args.epsilon, dpimagebench.protocol_delta(len(x)), 1.0)
    for variant in variants:
        started = time.time()
        fitted = fit(x, y, 10, sigma, MerfSettings(**{**BASE, **variant}))
        fit_s = time.time() - started
        labels = np.arange(args.n_generated) % 10
        images = fitted.draw(labels, seed=1, out_size=(28, 28))
        s = dpimagebench.score(images, labels, val, test, args.epsilon, epochs=args.epochs)
        row = {
            "variant": variant,
            "epsilon": args.epsilon,
            "sigma": sigma,
            "n_generated": args.n_generated,
            "epochs": args.epochs,
            "proxy_accuracy": s.accuracy,
            "test_curve": s.test_curve,
            "fit_s": round(fit_s, 1),
            "score_s": s.seconds,
            "date": today(),
            "machine": machine(),
        }
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
