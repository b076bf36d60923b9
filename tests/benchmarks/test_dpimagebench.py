"""DPImageBench's protocol as our benchmarks use it: its exact split, its delta, the checkpoint chosen
on noisy validation accuracy, and what a GPU lease can bring back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import random_split

from benchmarks import dpimagebench, gpu_preset
from synth.kinds.datasets import fashion_available


def test_the_split_is_the_one_dpimagebench_draws() -> None:
    torch.manual_seed(0)  # data/dataset_loader.py: torch.manual_seed(0); random_split(...)
    private, val = random_split(range(60_000), [55_000, 5_000])
    ours_private, ours_val = dpimagebench.split_indices(60_000)
    assert np.array_equal(ours_private, private.indices)
    assert np.array_equal(ours_val, val.indices)
    assert len(np.intersect1d(ours_private, ours_val)) == 0


def test_delta_is_one_over_n_log_n() -> None:
    assert dpimagebench.protocol_delta(55_000) == pytest.approx(1 / (55_000 * math.log(55_000)))
    with pytest.raises(ValueError):
        dpimagebench.protocol_delta(1)


def _stripes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class c: a bright horizontal band at row 4c (an easy 5-class task)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, n)
    images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 4 * c : 4 * c + 3] = 230
    return images, labels


def test_the_score_trains_on_the_release_and_reports_the_test_accuracy() -> None:
    images, labels = _stripes(600, 0)
    val, test = _stripes(200, 1), _stripes(300, 2)
    s = dpimagebench.score(images, labels, val, test, epsilon=1.0, epochs=3)
    assert s.classifier == "cpu-cnn" and s.epochs == 3 and s.n_train == 600
    assert s.precision == "float32"  # the protocol's, unless bfloat16 is asked for (test below)
    assert len(s.test_curve) == len(s.val_curve) == 3
    assert s.accuracy in s.test_curve and s.accuracy_clean_selection in s.test_curve
    assert s.best_test == max(s.test_curve) and s.best_test > 0.5  # chance: 0.2
    wrong = dpimagebench.score(images, (labels + 1) % 5, val, test, epsilon=1.0, epochs=2)
    assert wrong.best_test < 0.3  # labels that do not match the images teach nothing


def test_bfloat16_autocast_learns_the_same_task_and_says_so() -> None:
    images, labels = _stripes(600, 0)
    val, test = _stripes(200, 1), _stripes(300, 2)
    s = dpimagebench.score(images, labels, val, test, epsilon=1.0, epochs=3, precision="bfloat16")
    assert s.precision == "bfloat16" and s.best_test > 0.5  # chance: 0.2
    # the default's float32 is asserted by test_the_score_trains_on_the_release_and_reports_the_test_accuracy
    with pytest.raises(ValueError, match="precision must be one of"):
        dpimagebench.score(images, labels, val, test, 1.0, epochs=1, precision="float16")


def test_a_lease_brings_back_whole_releases_while_they_fit_then_parts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for tag in ("first", "second"):  # noise: what compresses as badly as generated images
        np.savez_compressed(
            tmp_path / f"{tag}.npz",
            images=rng.integers(0, 256, (3000, 28, 28), dtype=np.uint8),
            labels=np.repeat(np.arange(10), 300),
        )
    whole = (tmp_path / "first.npz").stat().st_size
    gpu_preset.fit_releases(tmp_path, mib=1.5 * whole / 2**20)
    assert (tmp_path / "first.npz").stat().st_size == whole
    with np.load(tmp_path / "second.npz") as cut:
        assert len(cut["labels"]) == 3000  # 300 a class is under 600: nothing to cut
    gpu_preset.fit_releases(tmp_path, mib=0.5 * whole / 2**20)
    with np.load(tmp_path / "first.npz") as cut:
        assert np.bincount(cut["labels"]).tolist() == [300] * 10
    rows = [json.loads(x) for x in (tmp_path / gpu_preset.LOG).read_text().splitlines()]
    assert all(r["kept_images"] == r["of"] == 3000 for r in rows)


def test_the_moving_average_follows_dpimagebench_s_rule() -> None:
    """shadow <- d * shadow + (1 - d) * param with d = min(decay, (1 + n) / (10 + n)), per tensor."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    ema = dpimagebench._Ema(model, 0.9999)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update(model)
        d = min(0.9999, (1 + n) / (10 + n))
        expected = [d * e + (1 - d) * p.detach() for e, p in zip(expected, model.parameters())]
    for s, e in zip(ema.shadow, expected, strict=True):
        torch.testing.assert_close(s, e)
    before = [p.detach().clone() for p in model.parameters()]
    ema.swap(model)
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e)
    ema.swap(model)
    for p, b in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p.detach(), b)


@pytest.mark.skipif(
    not fashion_available(), reason="apt package dataset-fashion-mnist is not installed"
)
def test_sets_written_once_score_a_release_without_the_data_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """--write-sets saves Fashion-MNIST's 5,000 validation and 10,000 test images; --sets reads them back
    (what a GPU lease carries instead of our packages and the data), and a mismatched --dataset is refused.
    The score reads the written file cut to its first 1,000 images of each set (every key it wrote,
    the same format): the score evaluates every image each epoch, ~3 s for all 15,000."""
    import sys

    sets = tmp_path / "sets.npz"
    monkeypatch.setattr(sys, "argv", ["dpimagebench", "--write-sets", str(sets)])
    dpimagebench.main()
    val, test = dpimagebench.protocol_sets("builtin:fashion-mnist", "builtin:fashion-mnist-test")
    with np.load(sets) as saved:
        assert np.array_equal(saved["val_images"], val[0]) and np.array_equal(
            saved["val_labels"], val[1]
        )
        assert saved["test_images"].shape == (10_000, 28, 28) and np.array_equal(
            saved["test_labels"], test[1]
        )
    cut = tmp_path / "sets-cut.npz"
    with np.load(sets) as saved:
        np.savez_compressed(cut, **{k: v[:1000] if v.ndim else v for k, v in saved.items()})
    release = tmp_path / "release.npz"
    np.savez_compressed(release, images=val[0][:600], labels=val[1][:600])
    out = tmp_path / "scores.jsonl"
    argv = ["dpimagebench", str(release), "--epsilon", "1", "--epochs", "1", "--sets", str(cut)]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    dpimagebench.main()
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["n_generated"] == 600 and row["epochs"] == 1 and 0.0 <= row["accuracy"] <= 1.0
    monkeypatch.setattr(sys, "argv", [*argv, "--dataset", "mnist", "--out", str(out)])
    with pytest.raises(SystemExit):
        dpimagebench.main()
    assert "holds fashion's sets, not mnist's" in capsys.readouterr().err
