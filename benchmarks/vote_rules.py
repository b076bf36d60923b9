"""Vote-rule ablation on one trained PrivImage demo model: which way of voting makes the better
release, paired on the same candidates, variations and vote noise.

    python -m benchmarks.vote_rules MODEL_DIR TAG pixel,pixel+k4,blurred [--noise-seed 100]

MODEL_DIR is a demo release's saved DP model (`ARTIFACTS/<release>/work/model` after `make demo`).
The script draws the demo's 8,000 candidates once (cached in the temporary directory, by TAG), then
for each rule runs the product's four vote rounds (`vote.evolve`: sigma 2, 8 variations of each
winner at strength 0.4), the 3 release variations at 0.15, and scores the 4,000 images with the
audit's CNN (all images, 8 epochs) for seeds 0-7 on the 1,000 held-out MNIST-5k digits. Rules:
`pixel` (the product's pixel L2), `blurred` (pixels blurred by a Gaussian of std 1 px first;
`blurred@S` for std S), either with `+kK` (each sensitive image votes 1/sqrt(K) for its K nearest:
the product's `vote_neighbours`), `+wW` (the last round keeps W winners, W a divisor of 4,000,
each released with 4,000/W - 1 variations instead of the product's 1,000 winners with 3 each),
`+vV` (each of the last round's winners released with V variations instead of 4,000/W - 1: a
release of W x (V + 1) images; the variations cost no privacy, only sampling and audit time) and
`+sS` (vote noise std S instead of 2: the same standard normal draws, scaled; a lower S charges
more, which the DP-SGD stage pays for with more noise, so this row measures the vote's side only).

`--sampler` and `--steps` draw the candidates and every variation with another sampler (the
preset's DPM-Solver++ at 12 steps, or DDIM at 25 as before 2026-12-07, the default here so that
earlier rows keep their meaning); candidates are cached per sampler.

This is an ablation, not a release: the vote noise comes from a seeded numpy generator
(`--noise-seed`, the same draws for every rule) so that the rules differ only in how they vote, and
nothing is charged. Rows go to benchmarks/results/vote-rules.jsonl with machine and date.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import machine, today
from benchmarks.release_seeds import seed_scores
from synth.kinds.datasets import BUILTINS
from synth.mechanisms.privimage import vote
from synth.mechanisms.privimage.config import SAMPLERS
from synth.mechanisms.privimage.data import label_index
from synth.mechanisms.privimage.model import load_model
from synth.mechanisms.privimage.sampling import balanced_labels, sample_images, vary_images

RESULTS = Path(__file__).parent / "results" / "vote-rules.jsonl"
BASE, POOL, ROUNDS, SIGMA, STRENGTH, RELEASED = 1000, 8, 4, 2.0, 0.4, 4000


def blurred(std: float) -> vote.Featurize:
    from scipy.ndimage import gaussian_filter

    def featurize(images: np.ndarray) -> np.ndarray:
        x = gaussian_filter(images.astype(np.float32) / 255.0, (0.0, std, std))
        return x.reshape(len(images), -1)

    return featurize


def parse_rule(rule: str) -> tuple[vote.Featurize, int, int, float, int]:
    """(features, neighbours, last round's winners, vote noise std, release variations of each
    winner) of a rule `SPACE[@STD][+kK][+wW][+vV][+sS]`."""
    space, *options = rule.split("+")
    name, _, std = space.partition("@")
    opts = {o[:1]: o[1:] for o in options}
    if (
        name not in ("pixel", "blurred")
        or set(opts) - {"k", "w", "v", "s"}
        or not all(v.replace(".", "", 1).isdigit() for v in opts.values())
        or not all(opts[o].isdigit() for o in set(opts) & {"k", "w", "v"})
    ):
        raise SystemExit(
            f"unknown rule {rule!r}: pixel or blurred[@STD], optionally +kK, +wW, +vV, +sS"
        )
    winners = int(opts.get("w", BASE))
    if winners < BASE or RELEASED % winners:
        raise SystemExit(f"rule {rule!r}: W must divide {RELEASED} and be at least {BASE}")
    featurize = blurred(float(std or 1.0)) if name == "blurred" else vote.pixel_features
    sigma = float(opts.get("s", SIGMA))
    if not 0.0 < sigma < 100.0:
        raise SystemExit(f"rule {rule!r}: the vote noise S must be in (0, 100)")
    copies = int(opts.get("v", RELEASED // winners - 1))
    if copies > 15:
        raise SystemExit(f"rule {rule!r}: V is at most 15 variations a winner")
    return featurize, int(opts.get("k", 1)), winners, sigma, copies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("tag")
    ap.add_argument("rules")
    ap.add_argument("--noise-seed", type=int, default=100)
    ap.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--sampler", default="ddim", choices=SAMPLERS)
    ap.add_argument("--steps", type=int, default=25, help="sampler steps (the preset: DDIM, 25)")
    args = ap.parse_args()
    model, meta = load_model(args.model_dir)
    dev, labels = torch.device("cpu"), meta["label_values"]
    den = dict(
        train_timesteps=meta.get("train_timesteps", 1000),
        ddim_steps=args.steps,
        batch=125,
        precision=args.precision,
        sampler=args.sampler,
    )
    sens, held = BUILTINS["builtin:mnist5k"](), BUILTINS["builtin:mnist5k-heldout"]()
    spos, hpos = label_index(sens.labels, labels), label_index(held.labels, labels)
    cpos = balanced_labels(BASE * POOL, len(labels))
    solver = "" if (args.sampler, args.steps) == ("ddim", 25) else f"-{args.sampler}{args.steps}"
    cache = (
        Path(tempfile.gettempdir())
        / f"vote-rules-candidates-{args.tag}-{args.precision}{solver}.npz"
    )
    if cache.exists():
        cand = np.load(cache)["x"]
    else:
        cand = sample_images(model, cpos, image_size=28, channels=1, seed=0, device=dev, **den)
        np.savez_compressed(cache, x=cand)

    def vary(images: np.ndarray, positions: np.ndarray, r: int) -> np.ndarray:
        return vary_images(
            model, images, positions, strength=STRENGTH, copies=POOL, seed=r, device=dev, **den
        )

    for rule in args.rules.split(","):
        featurize, k, winners, sigma, copies = parse_rule(rule)
        t0, draws = time.time(), iter(range(args.noise_seed, args.noise_seed + ROUNDS))

        def seeded(votes: np.ndarray, std: float, draws=draws) -> np.ndarray:  # noqa: ANN001
            rng = np.random.default_rng(next(draws))
            return votes.astype(np.float64) + std * rng.standard_normal(len(votes))

        real_noise, vote.noisy_votes = vote.noisy_votes, seeded
        try:
            # The product's rounds; the last one, written out, may keep more winners (+wW).
            imgs, pos = vote.evolve(
                sens.images,
                spos,
                cand,
                cpos,
                balanced_labels(BASE, len(labels)),
                [sigma] * (ROUNDS - 1),
                vary,
                POOL,
                featurize=featurize,
                neighbours=k,
            )
            last, last_pos = vary(imgs, pos, ROUNDS - 1), np.repeat(pos, POOL)
            keep, _ = vote.vote_and_select(
                sens.images,
                spos,
                last,
                last_pos,
                balanced_labels(winners, len(labels)),
                sigma,
                featurize,
                neighbours=k,
            )
            imgs, pos = last[keep], last_pos[keep]
        finally:
            vote.noisy_votes = real_noise
        release, rpos = imgs, pos
        if copies:
            var = vary_images(
                model, imgs, pos, strength=0.15, copies=copies, seed=1000, device=dev, **den
            )
            release = np.concatenate(
                [imgs[:, None], var.reshape(len(imgs), copies, 28, 28)], 1
            ).reshape(-1, 28, 28)
            rpos = np.repeat(pos, copies + 1)
        cnn = seed_scores(release, rpos, held.images, hpos, seeds=8)
        row = {
            "tag": args.tag,
            "rule": rule,
            "noise_seed": args.noise_seed,
            "precision": args.precision,
            "sampler": f"{args.sampler} {args.steps}",
            "cnn": [round(a, 4) for a in cnn],
            "cnn_mean": round(float(np.mean(cnn)), 4),
            "seconds": round(time.time() - t0),
            "machine": machine(),
            "date": today(),
        }
        print(json.dumps(row), flush=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
