"""PrivImage pieces without training: query histogram and sensitivity, selection, plan, config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accounting.epsilon import epsilon_rdp
from accounting.errors import InvalidParameterError, PrivReleaseError
from accounting.events import DpSgd, GaussianQuery
from synth.mechanisms.privimage import PrivImageConfig, plan_privimage
from synth.mechanisms.privimage.augment import augment_public
from synth.mechanisms.privimage.data import label_index, to_format, to_tensor, to_uint8
from synth.mechanisms.privimage.plan import query_event, sample_rate_for
from synth.mechanisms.privimage.query import (
    build_selection,
    noisy_semantic_histogram,
    select_classes,
    semantic_histogram,
)


def _top_k(rng: np.random.Generator, n: int, k: int, n_public: int) -> np.ndarray:
    return np.stack([rng.choice(n_public, k, replace=False) for _ in range(n)])


def test_histogram_counts_each_image_k_times_in_its_row() -> None:
    top = np.array([[0, 2], [2, 3], [0, 1]])
    rows = np.array([0, 0, 1])
    hist = semantic_histogram(top, rows, n_rows=2, n_public=4)
    assert hist.tolist() == [[1, 0, 2, 1], [1, 1, 0, 0]]
    assert hist.sum() == top.size


@pytest.mark.parametrize("k", [1, 3, 5])
def test_histogram_l2_sensitivity_is_sqrt_k(k: int) -> None:
    rng = np.random.default_rng(k)
    top, rows = _top_k(rng, 50, k, 20), rng.integers(0, 4, 50)
    full = semantic_histogram(top, rows, 4, 20)
    for i in range(50):  # remove each record in turn (add/remove-one neighbours)
        keep = np.arange(50) != i
        diff = full - semantic_histogram(top[keep], rows[keep], 4, 20)
        assert np.linalg.norm(diff) == pytest.approx(math.sqrt(k))


def test_noisy_histogram_noise_has_the_planned_std() -> None:
    rng = np.random.default_rng(0)
    top, rows = _top_k(rng, 300, 3, 50), rng.integers(0, 40, 300)
    noisy = noisy_semantic_histogram(top, rows, 40, 50, noise_std=7.0, rng=np.random.default_rng(1))
    noise = noisy - semantic_histogram(top, rows, 40, 50)
    assert noise.std() == pytest.approx(7.0, rel=0.05)
    assert abs(noise.mean()) < 0.5


def test_query_event_matches_sensitivity_and_sigma() -> None:
    cfg = PrivImageConfig(
        epsilon=5, delta=1e-5, k=4, query_sigma=10.0, finetune_epochs=1, batch_size=100
    )
    q = query_event(cfg)
    assert isinstance(q, GaussianQuery)
    assert q.sensitivity == pytest.approx(2.0) and q.sigma == pytest.approx(20.0)
    assert q.noise_multiplier == pytest.approx(10.0)


def test_selection_is_top_k_and_disjoint() -> None:
    noisy = np.array(
        [
            [50, 40, 1, 0, 30, 0],
            [45, 2, 35, 0, 0, 20],  # wants class 0 too, but row 0 has it more often
        ],
        dtype=float,
    )
    chosen = select_classes(noisy, 2)
    assert chosen == [[0, 1], [2, 5]]
    flat = [j for cols in chosen for j in cols]
    assert len(flat) == len(set(flat))


def test_selection_runs_out_gracefully_and_refuses_too_few_classes() -> None:
    noisy = np.random.default_rng(0).normal(size=(3, 4))
    chosen = select_classes(noisy, 3)
    assert all(len(c) >= 1 for c in chosen) and sum(len(c) for c in chosen) == 4
    with pytest.raises(InvalidParameterError, match="public set has 2 classes"):
        select_classes(np.zeros((3, 2)), 1)


def test_build_selection_relabels_with_the_choosing_class() -> None:
    public_labels = np.array([0, 1, 2, 3, 0, 3, 5])
    sel = build_selection([[3], [0, 5]], public_labels)
    assert sel.public_index.tolist() == [0, 3, 4, 5, 6]
    assert sel.new_labels.tolist() == [1, 0, 1, 0, 1]
    assert sel.ratio == pytest.approx(5 / 7)


def test_plan_meets_target_over_the_whole_history_and_is_deterministic() -> None:
    cfg = PrivImageConfig(epsilon=3.0, delta=1e-5, finetune_epochs=2, batch_size=250)
    prior = [GaussianQuery(sigma=5.0)]
    a, b = (
        plan_privimage(cfg, 4000, prior, n_classes=10),
        plan_privimage(cfg, 4000, prior, n_classes=10),
    )
    assert a == b
    assert a.sample_rate == sample_rate_for(4000, 250) == 1 / 16 and a.steps == 32
    assert epsilon_rdp(prior + a.events, 1e-5) <= 3.0
    assert epsilon_rdp(prior + a.events, 1e-5) == pytest.approx(3.0, rel=1e-3)
    fresh = plan_privimage(cfg, 4000, n_classes=10)
    assert fresh.noise_multiplier < a.noise_multiplier  # prior spend forces more noise
    assert [type(e) for e in a.events] == [GaussianQuery, DpSgd]


def test_baseline_plans_have_no_query() -> None:
    plan = plan_privimage(
        PrivImageConfig(epsilon=2, delta=1e-5, selection="all", finetune_epochs=1, batch_size=100),
        1000,
        n_classes=10,
    )
    assert [type(e) for e in plan.events] == [DpSgd] and plan.query_event is None


@pytest.mark.parametrize(
    "bad",
    [
        dict(epsilon=float("nan")),
        dict(epsilon=-1),
        dict(delta=1.5),
        dict(k=0),
        dict(query_sigma=float("inf")),
        dict(image_size=64),
        dict(selection="random"),
        dict(batch_size=0),
        dict(ema_decay=1.0),
        dict(max_grad_norm=0),
        dict(unet_channels=(12, 24)),
        dict(ddim_steps=2000),
        dict(device="tpu"),
        dict(finetune_epochs=float("nan")),
    ],
)
def test_config_rejects_bad_values(bad: dict) -> None:
    args = dict(epsilon=1.0, delta=1e-5) | bad
    with pytest.raises(PrivReleaseError):
        PrivImageConfig(**args)


def test_plan_rejects_batch_larger_than_data() -> None:
    with pytest.raises(InvalidParameterError, match="larger than the dataset"):
        plan_privimage(PrivImageConfig(epsilon=1, delta=1e-5, batch_size=500), 100, n_classes=10)


def test_formats_round_trip_and_label_mapping() -> None:
    grey = np.random.default_rng(0).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    rgb = to_format(grey, 32, 3)
    assert rgb.shape == (3, 32, 32, 3)
    assert to_format(rgb, 28, 1).shape == (3, 28, 28)
    assert np.array_equal(to_uint8(to_tensor(grey)), grey)
    assert label_index(np.array([7, 3, 7]), [3, 7]).tolist() == [1, 0, 1]
    with pytest.raises(InvalidParameterError):
        label_index(np.array([4]), [3, 7])


def test_augment_keeps_shape_range_and_background() -> None:
    import torch

    x = torch.full((8, 1, 28, 28), -1.0)
    x[:, :, 10:18, 10:18] = 1.0
    out = augment_public(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.min() >= -1 - 1e-6 and out.max() <= 1 + 1e-6
    assert torch.allclose(out[:, :, 0, 0], torch.tensor(-1.0))  # corners stay background
    assert not torch.allclose(out, x)
