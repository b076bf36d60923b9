"""The recipe ablation's scoring of a voted release (its training runs in `make ablate`): with vote rounds on,
it scores the winners of the last round beside a random quarter of the first round's candidates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import recipe_ablation
from synth.kinds.datasets import ImageDataset, load_source
from synth.mechanisms.privimage import PrivImageConfig
from synth.mechanisms.privimage.model import make_unet


def _subset(ds: ImageDataset, n: int) -> ImageDataset:
    idx = np.concatenate([np.flatnonzero(ds.labels == c)[: n // 10] for c in range(10)])
    return ImageDataset(ds.images[idx], ds.labels[idx], ds.class_names, ds.source)


def test_voted_rows_score_the_last_rounds_winners_or_rounds_along_the_way_and_a_random_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One 3-round vote config scored twice (its plan, seconds of calibration and PLD, is computed
    once: a process remembers both). By default the last round's winners are scored beside a random
    pick; scoring after rounds 1 and 3 gives the same winners as two separate evolve runs would:
    round 1's winners, then those of rounds 2-3 voted on their variations."""
    cfg = PrivImageConfig.tiny(
        8.0, 1e-5, k=1, vote_sigma=2.0, vote_pool=2, vote_rounds=3, n_samples=20
    )
    sensitive = _subset(load_source("builtin:mnist5k"), 200)
    heldout = _subset(load_source("builtin:mnist5k-heldout"), 100)

    def score(name: str, **kw) -> tuple[Path, list]:
        out = tmp_path / name
        out.mkdir()
        monkeypatch.setattr(recipe_ablation, "RESULTS", out)  # the grids go here, not the repo
        torch.manual_seed(0)
        model = make_unet(28, 1, 10, (8, 16), 1)
        return out, recipe_ablation._score(model, cfg, heldout, [20], sensitive, **kw)

    out, rows = score("last")
    assert [(n, pick) for n, pick, _ in rows] == [
        (20, ", voted"),
        (20, ", random quarter of the same candidates"),
    ]
    for _, _, scores in rows:
        assert 0.0 <= scores["cnn"] <= 1.0 and (out / scores["grid"]).exists()

    out, rows = score("along", rounds_to_score=[1, 3])
    assert [pick for _, pick, _ in rows] == [
        ", voted, after round 1",
        ", voted, after round 3",
        ", random quarter of the same candidates",
    ]
    grids = {scores["grid"] for _, _, scores in rows}
    assert len(grids) == 3 and all((out / g).exists() for g in grids)
