"""A demo release scored by the audit's CNN with several classifier seeds: the release's own level,
apart from the one seed the audit draws.

    python -m benchmarks.release_seeds RELEASE_NPZ [RELEASE_NPZ ...] [--seeds 8]

RELEASE_NPZ is a release's `ARTIFACTS/<release>/release.npz` (its images and labels, as released)
from `make demo` on the built-in MNIST-5k. Each release is scored as the audit scores it (all its
images, 8 epochs, tested on the 1,000 held-out digits) with seeds 0..N-1; seed 0 is the audit's own
number. Prints one JSON row per release (the per-seed scores and their mean); nothing is written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from audit.utility import _cnn_accuracy
from synth.kinds.datasets import BUILTINS

EPOCHS = 8  # the demo policy's cnn_epochs


def seed_scores(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    seeds: int,
    epochs: int = EPOCHS,
) -> list[float]:
    """The audit's CNN accuracy on (test_x, test_y) after training on all of (train_x, train_y),
    for classifier seeds 0..seeds-1; classes counted as `audit.utility` counts them (max label + 1)."""
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    return [
        _cnn_accuracy(train_x, train_y, test_x, test_y, n_classes, epochs, s) for s in range(seeds)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("releases", nargs="+", type=Path)
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    held = BUILTINS["builtin:mnist5k-heldout"]()
    for path in args.releases:
        with np.load(path) as d:
            cnn = seed_scores(d["images"], d["labels"], held.images, held.labels, args.seeds)
        row = {"release": str(path), "cnn": [round(a, 4) for a in cnn]}
        print(json.dumps(row | {"cnn_mean": round(float(np.mean(cnn)), 4)}), flush=True)


if __name__ == "__main__":
    main()
