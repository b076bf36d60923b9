"""The private vote on PrivImage samples: nearest-candidate counts, their sensitivity, the noise, the
selection, the plan's event and its epsilon (cross-checked with dp-accounting directly)."""

from __future__ import annotations

import functools
import math

import dp_accounting
import numpy as np
import pytest

from accounting.epsilon import epsilon_rdp
from accounting.errors import InvalidParameterError, LedgerStateError
from accounting.events import DpSgd, GaussianQuery
from synth.mechanisms.privimage import PrivImageConfig, plan_privimage
from synth.mechanisms.privimage.vote import (
    evolve,
    nearest_candidate_votes,
    noisy_votes,
    select_by_votes,
    vote_and_select,
)


def _data(seed: int, n: int = 60, m: int = 40, classes: int = 3):
    rng = np.random.default_rng(seed)
    sens = rng.integers(0, 256, (n, 6, 6), dtype=np.uint8)
    cand = rng.integers(0, 256, (m, 6, 6), dtype=np.uint8)
    return sens, rng.integers(0, classes, n), cand, np.arange(m) % classes


def test_each_sensitive_image_votes_for_its_nearest_candidate_of_its_own_class() -> None:
    cand = np.zeros((4, 2, 2), dtype=np.uint8)
    cand[1], cand[3] = 200, 90  # class 0: candidates 0 (black) and 2 (grey 100); class 1: 1 and 3
    cand[2] = 100
    sens = np.stack([np.full((2, 2), v, dtype=np.uint8) for v in (10, 95, 250, 80)])
    votes = nearest_candidate_votes(sens, np.array([0, 0, 1, 1]), cand, np.array([0, 1, 0, 1]))
    # 10 -> black (0); 95 -> grey 100 (2), not the nearer grey 90 of class 1; 250 -> 200 (1); 80 -> 90 (3)
    assert votes.tolist() == [1, 1, 1, 1]
    assert votes.sum() == len(sens)


def test_votes_split_over_the_k_nearest_give_each_one_over_root_k() -> None:
    cand = np.stack([np.full((2, 2), v, dtype=np.uint8) for v in (0, 50, 100, 250, 60)])
    cpos = np.array([0, 0, 0, 0, 1])  # grey 60 is of the other class
    sens = np.full((1, 2, 2), 55, dtype=np.uint8)
    votes = nearest_candidate_votes(sens, np.array([0]), cand, cpos, neighbours=2)
    assert votes.dtype == np.float64  # 55 -> grey 50 and grey 100 (not 60: another class)
    assert np.allclose(votes, [0, 2**-0.5, 2**-0.5, 0, 0])
    assert np.linalg.norm(votes) == pytest.approx(1.0)
    with pytest.raises(InvalidParameterError, match="1 candidate.*lower vote_neighbours"):
        nearest_candidate_votes(sens, np.array([1]), cand, cpos, neighbours=2)


@pytest.mark.parametrize("seed,k", [(1, 3), (2, 4)])
def test_removing_one_sensitive_image_moves_the_k_nearest_votes_by_l2_one(
    seed: int, k: int
) -> None:
    """The split vote's L2 sensitivity is 1 (k counts, each by 1/sqrt(k)), which the plan's
    GaussianQuery(sensitivity=1) assumes; its L1 sensitivity is sqrt(k), which nothing uses."""
    sens, pos, cand, cpos = _data(seed)
    full = nearest_candidate_votes(sens, pos, cand, cpos, neighbours=k)
    assert full.sum() == pytest.approx(len(sens) * k**0.5)
    for i in range(len(sens)):
        keep = np.arange(len(sens)) != i
        diff = full - nearest_candidate_votes(sens[keep], pos[keep], cand, cpos, neighbours=k)
        assert np.count_nonzero(np.abs(diff) > 1e-9) == k
        assert np.linalg.norm(diff) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_removing_one_sensitive_image_changes_one_count_by_one(seed: int) -> None:
    """L2 (and L1) sensitivity 1 under add/remove-one: what the plan's GaussianQuery(sensitivity=1) assumes."""
    sens, pos, cand, cpos = _data(seed)
    full = nearest_candidate_votes(sens, pos, cand, cpos)
    for i in range(len(sens)):
        keep = np.arange(len(sens)) != i
        diff = full - nearest_candidate_votes(sens[keep], pos[keep], cand, cpos)
        assert np.abs(diff).sum() == 1 and np.linalg.norm(diff) == 1


def test_noise_has_the_planned_std_and_is_fresh() -> None:
    votes = np.zeros(20000, dtype=np.int64)
    a, b = noisy_votes(votes, 3.0), noisy_votes(votes, 3.0)
    assert a.std() == pytest.approx(3.0, rel=0.03) and abs(a.mean()) < 0.1
    assert not np.array_equal(a, b)


def test_selection_keeps_the_most_voted_of_each_class_in_the_wanted_numbers() -> None:
    noisy = np.array([5.0, 1.0, 9.0, 0.5, 7.0, 2.0])
    cpos = np.array([0, 1, 0, 1, 0, 1])
    keep = select_by_votes(noisy, cpos, wanted_pos=np.array([0, 0, 1]))
    assert sorted(keep[:2].tolist()) == [2, 4] and keep[2:].tolist() == [5]
    with pytest.raises(InvalidParameterError, match="candidates for"):
        select_by_votes(noisy, cpos, wanted_pos=np.array([1, 1, 1, 1]))


def test_vote_refuses_mismatched_formats_and_missing_classes() -> None:
    sens, pos, cand, cpos = _data(0)
    with pytest.raises(InvalidParameterError, match="same format"):
        nearest_candidate_votes(sens[:, :5], pos, cand, cpos)
    with pytest.raises(InvalidParameterError, match="No candidate of class"):
        nearest_candidate_votes(sens, pos, cand[cpos != 2], cpos[cpos != 2])


def test_vote_and_select_releases_wanted_counts() -> None:
    sens, pos, cand, cpos = _data(3, m=60)
    keep, noisy = vote_and_select(sens, pos, cand, cpos, np.repeat(np.arange(3), 5), sigma=1.0)
    assert len(keep) == 15 and len(set(keep.tolist())) == 15 and noisy.shape == (60,)
    assert np.bincount(cpos[keep]).tolist() == [5, 5, 5]


def test_plan_charges_the_vote_after_dpsgd_and_meets_the_target() -> None:
    cfg = PrivImageConfig(
        epsilon=8.0,
        delta=1e-5,
        k=1,
        query_sigma=10.0,
        finetune_epochs=8,
        batch_size=250,
        vote_sigma=3.0,
    )
    plan = plan_privimage(cfg, 4000, n_classes=10)
    query, dp, vote = plan.events
    assert (
        isinstance(query, GaussianQuery)
        and isinstance(dp, DpSgd)
        and isinstance(vote, GaussianQuery)
    )
    assert plan.query_event is query and plan.vote_event is vote and plan.dpsgd_event is dp
    assert vote.sigma == 3.0 and vote.sensitivity == 1.0
    # independent: dp-accounting's RDP accountant fed the three mechanisms by hand
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(10.0))
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                dp.sample_rate, dp_accounting.GaussianDpEvent(dp.noise_multiplier)
            ),
            dp.steps,
        )
    )
    acc.compose(dp_accounting.GaussianDpEvent(3.0))
    assert acc.get_epsilon(1e-5) == pytest.approx(8.0, rel=1e-2)
    assert epsilon_rdp(plan.events, 1e-5) <= 8.0 + 1e-9
    # the vote costs DP-SGD noise: more than without it, less than 2% more at this epsilon
    without = plan_privimage(cfg.with_(vote_sigma=0.0), 4000, n_classes=10)
    assert without.vote_event is None and len(without.events) == 2
    assert without.noise_multiplier < plan.noise_multiplier < 1.02 * without.noise_multiplier


def test_baseline_plan_with_a_vote_has_no_query() -> None:
    cfg = PrivImageConfig(
        epsilon=5.0, delta=1e-5, selection="none", finetune_epochs=1, batch_size=100, vote_sigma=4.0
    )
    plan = plan_privimage(cfg, 1000, n_classes=10)
    assert plan.query_event is None and plan.vote_event is plan.events[-1]
    assert [type(e) for e in plan.events] == [DpSgd, GaussianQuery]


def test_plan_charges_the_vote_once_per_round() -> None:
    """Private Evolution rounds compose: three rounds at sigma 3 cost what dp-accounting says three Gaussian
    queries cost, and more DP-SGD noise than one round."""
    cfg = PrivImageConfig(
        epsilon=8.0,
        delta=1e-5,
        k=1,
        query_sigma=10.0,
        finetune_epochs=8,
        batch_size=250,
        vote_sigma=3.0,
        vote_rounds=3,
    )
    plan = plan_privimage(cfg, 4000, n_classes=10)
    assert [type(e) for e in plan.events] == [GaussianQuery, DpSgd, GaussianQuery]
    assert (
        plan.vote_event == GaussianQuery(sigma=3.0, sensitivity=1.0, count=3)
        and plan.vote_sigmas == [3.0] * 3
    )
    assert "x3" in plan.vote_event.describe()
    dp = plan.dpsgd_event
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(10.0))
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                dp.sample_rate, dp_accounting.GaussianDpEvent(dp.noise_multiplier)
            ),
            dp.steps,
        )
    )
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), 3))
    assert acc.get_epsilon(1e-5) == pytest.approx(8.0, rel=1e-2)
    assert epsilon_rdp(plan.events, 1e-5) <= 8.0 + 1e-9
    assert (
        plan.noise_multiplier
        > plan_privimage(cfg.with_(vote_rounds=1), 4000, n_classes=10).noise_multiplier
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"vote_sigma": float("nan")},
        {"vote_sigma": -1.0},
        {"vote_sigma": 1e308},
        {"vote_sigma": math.inf},
        {"vote_sigma": "3"},
        {"vote_sigma": 3.0, "vote_pool": 1},
        {"vote_sigma": 3.0, "vote_pool": 1000},
        {"vote_pool": 0},
        {"vote_rounds": 0},
        {"vote_rounds": 9},
        {"vote_rounds": 2.5},
        {"vote_rounds": 1e308},
        {"variation_strength": 0.0},
        {"variation_strength": 1.5},
        {"variation_strength": float("nan")},
        {"variation_strength": "0.5"},
    ],
)
def test_config_rejects_bad_vote_settings(bad: dict) -> None:
    with pytest.raises(InvalidParameterError):
        PrivImageConfig(epsilon=5.0, delta=1e-5, **bad)


def test_candidates_per_image_is_the_pool_only_with_the_vote_on() -> None:
    assert PrivImageConfig(epsilon=5.0, delta=1e-5, vote_pool=6).candidates_per_image == 1
    assert (
        PrivImageConfig(epsilon=5.0, delta=1e-5, vote_sigma=2.0, vote_pool=6).candidates_per_image
        == 6
    )


def test_evolve_votes_each_round_on_variations_of_the_last_winners_and_reuses_saved_rounds() -> (
    None
):
    sens, pos, cand, cpos = _data(4, m=60)
    wanted = np.repeat(np.arange(3), 5)
    seen: list[tuple[int, int]] = []

    def vary(images: np.ndarray, positions: np.ndarray, r: int) -> np.ndarray:
        seen.append((r, len(images)))
        return np.repeat(images, 2, 0)  # two copies of each winner (a stand-in for SDEdit)

    rounds: list[np.ndarray] = []
    out, out_pos = evolve(
        sens,
        pos,
        cand,
        cpos,
        wanted,
        [1.0, 1.0, 1.0],
        vary,
        2,
        on_round=lambda r, keep, noisy: rounds.append(keep),
    )
    assert seen == [(1, 15), (2, 15)] and len(rounds) == 3  # each later round varies the 15 winners
    assert out.shape == (15, 6, 6) and np.bincount(out_pos).tolist() == [5, 5, 5]
    assert all(
        any((o == c).all() for c in cand) for o in out
    )  # copies of round-0 candidates, nothing else
    # resuming after round 2: rounds 1-2 are not voted again, only round 3 is
    again: list[int] = []
    evolve(
        sens,
        pos,
        cand,
        cpos,
        wanted,
        [1.0, 1.0, 1.0],
        vary,
        2,
        saved=rounds[:2],
        on_round=lambda r, keep, noisy: again.append(r),
    )
    assert again == [2]
    with pytest.raises(LedgerStateError, match="round 2 selects candidates this run did not draw"):
        evolve(
            sens,
            pos,
            cand,
            cpos,
            wanted,
            [1.0, 1.0],
            vary,
            2,
            saved=[rounds[0], np.array([10_000])],
        )


@pytest.mark.parametrize(
    "bad",
    [
        {"release_variations": -1},
        {"release_variations": 16},
        {"release_variations": 2.5},
        {"release_variations": True},
        {"release_variations": "3"},
        {"release_variation_strength": 0.0},
        {"release_variation_strength": float("nan")},
        {"release_variation_strength": 1e308},
    ],
)
def test_config_rejects_bad_release_variations(bad: dict) -> None:
    with pytest.raises(InvalidParameterError, match="release_variation"):
        PrivImageConfig(epsilon=5.0, delta=1e-5, **bad)


def test_release_variations_shrink_what_is_drawn_and_voted_not_what_is_released() -> None:
    demo = PrivImageConfig.demo(8.0, 1e-5)
    assert (demo.n_samples, demo.base_images, demo.base_images * demo.candidates_per_image) == (
        4000,
        1000,
        8000,
    )
    assert (
        PrivImageConfig(epsilon=5.0, delta=1e-5, n_samples=10, release_variations=3).base_images
        == 3
    )
    assert PrivImageConfig(epsilon=5.0, delta=1e-5, n_samples=10).base_images == 10


# ------------------------------------------------------------------ the vote in EfficientNet-Lite0's space
def _fast_precision() -> str:
    import torch

    from synth.mechanisms.privimage.precision import native_bfloat16

    return "bfloat16" if native_bfloat16(torch.device("cpu")) else "float32"


@functools.lru_cache(maxsize=4)
def _shift_or_other_class(n: int, shift: int = 5):
    """n MNIST digits; for each, two candidates of its class position: the digit shifted `shift` pixels right,
    and a digit of another class that is close to it in pixels (the 6th nearest)."""
    from synth.kinds.datasets import load_source

    d = load_source("builtin:mnist5k")
    idx = np.random.default_rng(0).choice(len(d.images), n, replace=False)
    sens, cand = [], []
    for i in idx:
        others = d.images[d.labels != d.labels[i]]
        near = np.argsort(((others.astype(np.float32) - d.images[i]) ** 2).sum((1, 2)))[5]
        sens.append(d.images[i])
        cand += [np.roll(d.images[i], shift, axis=1), others[near]]
    return np.stack(sens), np.arange(n), np.stack(cand), np.repeat(np.arange(n), 2)


def test_embedding_vote_picks_the_shifted_copy_where_pixel_l2_picks_another_class() -> None:
    from synth.mechanisms.privimage.vote import embedding_features

    sens, pos, cand, cpos = _shift_or_other_class(12)
    pixel = nearest_candidate_votes(sens, pos, cand, cpos)
    embedded = nearest_candidate_votes(
        sens, pos, cand, cpos, featurize=embedding_features("cpu", "float32")
    )
    assert pixel[0::2].sum() == 0 and pixel[1::2].sum() == len(
        sens
    )  # pixels: every vote to the other class
    assert embedded[0::2].sum() >= 0.75 * len(
        sens
    )  # features: (nearly) every vote to the shifted copy


def test_embedding_features_do_not_depend_on_batchmates_and_are_unit_vectors() -> None:
    """The vote's sensitivity needs one image's features to be the same whatever else is featurised with it
    (float32 features of a batch of 1 and of 64 differ in the 5th digit without fixed-shape batches)."""
    from synth.mechanisms.privimage.vote import embedding_features

    sens, _, cand, _ = _shift_or_other_class(4)
    featurize = embedding_features("cpu", "float32")
    both = featurize(np.concatenate([sens, cand]))
    assert np.array_equal(both[:1], featurize(sens[:1])) and np.array_equal(
        both[len(sens) :], featurize(cand)
    )
    assert both.shape == (12, 1280) and np.allclose(np.linalg.norm(both, axis=1), 1.0, atol=1e-5)


def test_removing_one_sensitive_image_changes_one_embedding_vote_by_one() -> None:
    from synth.mechanisms.privimage.vote import embedding_features, nearest_votes

    sens, pos, cand, cpos = _shift_or_other_class(4)
    pos, cpos = pos % 2, cpos % 2  # two classes, four candidates each
    featurize = embedding_features("cpu", _fast_precision())
    cand_f = featurize(cand)
    full = nearest_votes(featurize(sens), pos, cand_f, cpos)
    assert full.sum() == len(sens)
    for i in range(len(sens)):
        keep = np.arange(len(sens)) != i
        diff = full - nearest_votes(featurize(sens[keep]), pos[keep], cand_f, cpos)
        assert np.abs(diff).sum() == 1 and np.linalg.norm(diff) == 1


def test_vote_space_charges_the_same_events_and_is_validated() -> None:
    cfg = PrivImageConfig(
        epsilon=8.0,
        delta=1e-5,
        k=1,
        query_sigma=10.0,
        finetune_epochs=8,
        batch_size=250,
        vote_sigma=2.0,
        vote_rounds=4,
    )
    pixel, embedding = (
        plan_privimage(cfg, 4000, n_classes=10),
        plan_privimage(cfg.with_(vote_space="embedding"), 4000, n_classes=10),
    )
    assert pixel.events == embedding.events and pixel.noise_multiplier == embedding.noise_multiplier
    assert PrivImageConfig(epsilon=5.0, delta=1e-5).vote_space == "pixel"
    assert (
        PrivImageConfig.from_dict(cfg.with_(vote_space="embedding").as_dict()).vote_space
        == "embedding"
    )
    for bad in ("inception", "", None, 1, "Embedding"):
        with pytest.raises(InvalidParameterError, match="vote_space must be one of"):
            PrivImageConfig(epsilon=5.0, delta=1e-5, vote_space=bad)
    from synth.mechanisms.privimage.vote import features_for, pixel_features

    assert features_for("pixel") is pixel_features
    with pytest.raises(InvalidParameterError, match="vote_space"):
        features_for("clip")


def test_vote_neighbours_charge_the_same_events_and_are_validated() -> None:
    cfg = PrivImageConfig(epsilon=8.0, delta=1e-5, k=1, vote_sigma=2.0, vote_pool=8, vote_rounds=4)
    one, four = (
        plan_privimage(cfg, 4000, n_classes=10),
        plan_privimage(cfg.with_(vote_neighbours=4), 4000, n_classes=10),
    )
    assert one.events == four.events and one.noise_multiplier == four.noise_multiplier
    assert cfg.vote_neighbours == 1 and PrivImageConfig.demo(8.0, 1e-5).vote_neighbours == 4
    stored = cfg.as_dict()
    del stored["vote_neighbours"]  # a plan stored before the option existed: one whole vote
    assert PrivImageConfig.from_dict(stored).vote_neighbours == 1
    for bad in (0, 65, 1.5, True, "4", float("nan"), None):
        with pytest.raises(
            InvalidParameterError, match="vote_neighbours (must be|is NaN; give) a whole number"
        ):
            cfg.with_(vote_neighbours=bad)
    with pytest.raises(
        InvalidParameterError, match=r"vote_neighbours \(9\) cannot exceed vote_pool"
    ):
        cfg.with_(vote_neighbours=9)
    assert cfg.with_(vote_sigma=0.0, vote_neighbours=9).vote_neighbours == 9  # no vote: unused


def test_evolve_featurises_the_sensitive_images_once_and_votes_in_the_given_space() -> None:
    from synth.mechanisms.privimage.vote import pixel_features

    sens, pos, cand, cpos = _data(5, m=60)
    calls: list[int] = []

    def featurize(images: np.ndarray) -> np.ndarray:
        calls.append(len(images))
        return -pixel_features(images)  # another space: the negated pixels (same distances)

    wanted = np.repeat(np.arange(3), 5)
    out, _ = evolve(
        sens,
        pos,
        cand,
        cpos,
        wanted,
        [0.5, 0.5],
        lambda im, p, r: np.repeat(im, 2, 0),
        2,
        featurize=featurize,
    )
    assert calls == [len(sens), 60, 30]  # sensitive once, then each round's candidates
    assert out.shape == (15, 6, 6)
