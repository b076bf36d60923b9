"""Priors that do not depend on matching public data: DP central images (charged, calibrated, cross-checked with
dp-accounting), procedural public images, and the semantic query's fit threshold with its fallback."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch

from accounting import ledger
from accounting.epsilon import RDP_ORDERS, epsilon_report
from accounting.errors import BudgetExceededError, InvalidParameterError
from accounting.events import DpSgd, GaussianQuery
from accounting.store import Store, Workspace
from release import runner
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import ImageDataset, load_source, uci_digits
from synth.mechanisms.privimage import PrivImageConfig, central, plan_privimage
from synth.mechanisms.privimage.procedural import KINDS, procedural_images
from synth.mechanisms.privimage.query import (
    build_selection,
    fit_floor,
    select_classes,
    select_fitting,
)

DELTA = 1e-4


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "bad",
    [
        dict(central_images=-1),
        dict(central_images=17),
        dict(central_images=1.5),
        dict(central_images="Auto"),
        dict(central_images="on"),
        dict(central_images=True),
        dict(central_sigma=0),
        dict(central_clip=-1.0),
        dict(central_steps=0),
        dict(fit_threshold=1.5),
        dict(share_public_classes="yes"),
        dict(procedural_images=0),
        dict(selection="imagenet"),
    ],
)
def test_prior_options_are_validated_up_front(bad: dict) -> None:
    with pytest.raises(InvalidParameterError):
        PrivImageConfig(epsilon=1.0, delta=DELTA, **bad)


# ------------------------------------------------------------------ central images: the mechanism and its charge
def test_central_event_is_planned_charged_and_calibrated_within_target() -> None:
    cfg = PrivImageConfig(
        epsilon=1.0,
        delta=1e-5,
        batch_size=250,
        finetune_epochs=4.0,
        central_images=2,
        central_sigma=10.0,
        frequency_warmup=False,
    )
    base = plan_privimage(cfg.with_(central_images=0), 60000, n_classes=10)
    p = plan_privimage(cfg, 60000, n_classes=10)
    assert p.central_event == GaussianQuery(
        sigma=10.0 * math.sqrt(2), sensitivity=math.sqrt(2), count=2
    )
    assert (
        p.query_event is p.events[0]
        and p.central_event is p.events[1]
        and isinstance(p.events[2], DpSgd)
    )
    assert p.epsilon.epsilon_rdp <= 1.0 + 1e-9
    assert (
        p.noise_multiplier > base.noise_multiplier
    )  # the DP-SGD noise pays for the central images
    again = type(p).from_json(p.to_json())
    assert again.central_event == p.central_event and again.query_event == p.query_event
    # without a semantic query the central event is still found, and no query is invented
    none = plan_privimage(cfg.with_(selection="procedural"), 60000, n_classes=10)
    assert none.query_event is None and none.central_event == p.central_event


# ------------------------------------------------------------------ central_images = "auto"
def test_auto_decides_from_public_metadata_only() -> None:
    # the noise on a central image's pixels for the average class: 10 * sqrt(2) * 8 / class size
    assert central.pixel_noise_std(10.0, 8.0, 6000) == pytest.approx(10 * math.sqrt(2) * 8 / 6000)
    decide = lambda n, classes: central.resolve_queries("auto", 10.0, 8.0, n, classes)  # noqa: E731
    assert decide(60000, 10) == central.AUTO_QUERIES  # Fashion-MNIST: 0.019 of the pixel range
    assert decide(4000, 10) == 0  # MNIST-5k: 0.28, noise more than signal
    # the bar is AUTO_MAX_PIXEL_NOISE, whatever the class count
    per_class = 10 * math.sqrt(2) * 8 / central.AUTO_MAX_PIXEL_NOISE
    assert decide(math.ceil(per_class) * 7, 7) == central.AUTO_QUERIES
    assert decide(math.floor(per_class) * 7 - 7, 7) == 0
    # a larger noise multiplier or clip needs larger classes
    assert central.resolve_queries("auto", 100.0, 8.0, 60000, 10) == 0
    # a number is taken as it is, large data or not
    assert central.resolve_queries(0, 10.0, 8.0, 60000, 10) == 0
    assert central.resolve_queries(3, 10.0, 8.0, 4000, 10) == 3


def test_auto_is_the_default_and_the_plan_charges_what_it_decided() -> None:
    cfg = PrivImageConfig(epsilon=1.0, delta=1e-5, batch_size=250, finetune_epochs=4.0)
    assert cfg.central_images == "auto"
    large = plan_privimage(cfg, 60000, n_classes=10)
    assert large.central_event == GaussianQuery(
        sigma=10.0 * math.sqrt(2), sensitivity=math.sqrt(2), count=central.AUTO_QUERIES
    )
    assert (
        large.central
        and type(large).from_json(large.to_json()).central_event == large.central_event
    )
    explicit = plan_privimage(cfg.with_(central_images=2), 60000, n_classes=10)
    assert large.events == explicit.events and large.noise_multiplier == explicit.noise_multiplier
    small = plan_privimage(cfg, 4000, n_classes=10)
    assert small.central_event is None and not small.central
    assert small.events == plan_privimage(cfg.with_(central_images=0), 4000, n_classes=10).events
    with pytest.raises(InvalidParameterError, match="n_classes"):
        plan_privimage(cfg, 60000)


def test_the_plan_states_its_choices_as_charged_and_which_auto_made() -> None:
    """The steward reads what auto decided before approving, and the lines agree with the events
    the plan charges (Fashion-MNIST-sized: both warm-ups on; MNIST-5k-sized: both off)."""
    mech = registry.get("privimage")
    pub = uci_digits()

    def plan(n: int, **settings) -> registry.MechanismPlan:
        info = registry.DatasetInfo("d", "d", n, tuple(range(10)), (28, 28), 1e-5)
        return mech.plan(PrivImageConfig(epsilon=1.0, delta=1e-5, **settings), info, [], pub)

    large = plan(60_000)
    p = plan_privimage(PrivImageConfig(epsilon=1.0, delta=1e-5), 60_000, n_classes=10)
    assert large.detail["choices"] == [
        "pre-training data: the 3 public classes nearest each sensitive class (picked by a DP "
        "query of the sensitive images)",
        "frequency warm-up: on (a DP random-feature generator's drawings pre-train the model; "
        "noise 0.28 of a class's mean embedding); chosen by auto",
        "central images: 2 per class (DP class means pre-train the model; noise 0.019 of the "
        "pixel range); chosen by auto",
        f"DP-SGD: {p.steps:,} steps at noise multiplier {p.noise_multiplier:.3g}, about "
        f"{round(p.expected_batch)} images a step (what epsilon leaves after the events above)",
    ]
    assert p.frequency and p.central_event is not None and p.central_event.count == 2
    small = plan(4_000).detail["choices"]
    assert small[1] == (
        "frequency warm-up: off (noise 4.21 of a class's mean embedding would drown it); "
        "chosen by auto"
    )
    assert small[2].startswith("central images: off (noise 0.28 of the pixel range") and (
        small[2].endswith("; chosen by auto")
    )
    # set explicitly: no "auto" on them; a vote is a line of its own
    set_ = plan(
        4_000, frequency_warmup=False, central_images=0, selection="procedural", vote_sigma=5.0
    ).detail["choices"]
    assert set_[:3] == [
        "pre-training data: generated shapes and textures (no public images)",
        "frequency warm-up: off",
        "central images: off",
    ]
    assert set_[4] == (
        "private vote: 1 round, each released image chosen from 4 candidates (noise std 5 on "
        "the votes)"
    )
    assert not any("auto" in line for line in set_)


def test_a_plan_whose_set_noise_events_exceed_the_target_names_them() -> None:
    """The demo preset's vote (4 rounds at sigma 1.75) alone spends more than epsilon 1: the steward
    was told to "run fewer steps", which could not help; now the error names the vote and its
    cost, and without the vote the same plan fits."""
    cfg = PrivImageConfig.demo(1.0, 1e-5)
    with pytest.raises(BudgetExceededError) as err:
        plan_privimage(cfg, 60_000, n_classes=10)
    msg = str(err.value)
    assert (cfg.vote_sigma, cfg.vote_rounds) == (1.75, 4)
    vote = GaussianQuery(sigma=1.75, sensitivity=1.0, count=4)
    alone = epsilon_report([vote], 1e-5).epsilon_rdp
    assert alone > 1.0 and f"the private vote (4 rounds at vote_sigma 1.75): {alone:.3g}" in msg
    assert "fewer steps" not in msg and "vote_sigma = 0" in msg and "the semantic query" in msg
    assert plan_privimage(cfg.with_(vote_sigma=0.0), 60_000, n_classes=10).noise_multiplier > 0
    # a prior spend that alone leaves nothing keeps the accountant's message: it is not the vote's
    spent = [GaussianQuery(sigma=0.5, sensitivity=1.0)]
    with pytest.raises(BudgetExceededError, match="prior spend already"):
        plan_privimage(cfg, 60_000, prior=spent, n_classes=10)


def test_auto_through_the_mechanism_uses_the_registered_label_count() -> None:
    """The mechanism's plan reads the class count from the registration (DatasetInfo.labels)."""
    mech = registry.get("privimage")
    pub = uci_digits()
    cfg = PrivImageConfig(
        epsilon=1.0, delta=1e-5, batch_size=250, finetune_epochs=1.0, share_public_classes=True
    )

    def info(n: int, classes: int) -> registry.DatasetInfo:
        return registry.DatasetInfo("d", "d", n, tuple(range(classes)), (28, 28), 1e-5)

    def central_count(plan: registry.MechanismPlan) -> int:
        found = [
            e for e in plan.events if isinstance(e, GaussianQuery) and e.sensitivity == math.sqrt(2)
        ]
        return found[0].count if found else 0

    large_classes = mech.plan(cfg, info(60000, 10), [], pub)
    assert central_count(large_classes) == central.AUTO_QUERIES
    assert large_classes.parameters["central_images"] == "auto"
    # the same record count over 100 classes: 600 per class, too few
    assert central_count(mech.plan(cfg, info(60000, 100), [], pub)) == 0


def test_plan_epsilon_with_the_warmups_equals_an_independent_dp_accounting_computation() -> None:
    cfg = PrivImageConfig(
        epsilon=3.0,
        delta=1e-5,
        batch_size=250,
        finetune_epochs=4.0,
        central_images=3,
        central_sigma=8.0,
        vote_sigma=8.0,
    )
    p = plan_privimage(cfg, 60000, n_classes=10)
    assert p.frequency_event is not None  # "auto": 6,000 a class
    # the same mechanisms written out by hand with dp-accounting alone
    query = dp_accounting.GaussianDpEvent(cfg.query_sigma)  # sqrt(k) sigma / sqrt(k)
    freq = dp_accounting.GaussianDpEvent(cfg.frequency_sigma)  # sensitivity 1
    cent = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(8.0), 3)
    sgd = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            1 / 240, dp_accounting.GaussianDpEvent(p.noise_multiplier)
        ),
        960,
    )
    vote = dp_accounting.GaussianDpEvent(8.0)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(dp_accounting.ComposedDpEvent([query, freq, cent, sgd, vote]))
    assert p.epsilon.epsilon_rdp == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dp_accounting.ComposedDpEvent([query, freq, cent, sgd, vote]))
    assert p.epsilon.epsilon_pld == pytest.approx(pld.get_epsilon(1e-5), rel=1e-2)


def test_central_means_have_the_planned_noise_and_clip_each_image() -> None:
    n, rows = 4000, np.repeat(np.arange(2), 2000)
    x = torch.full((n, 1, 8, 8), 1.0)  # white: half-res norm 4 in [0, 1] pixels
    means, counts = central.noisy_class_means(
        x, rows, 2, clip=2.0, noise_multiplier=5.0, rng=np.random.default_rng(0)
    )
    # each image clipped to norm 2 (every pixel 0.5), noisy sum / noisy count: 0.5 up to noise of std
    # 5 * sqrt(2) * 2 / 2000 = 0.007 per pixel
    assert np.allclose(means, 0.5, atol=0.05) and np.allclose(counts, 2000, atol=50)
    assert np.std(means - 0.5) == pytest.approx(5 * math.sqrt(2) * 2 / 2000, rel=0.4)
    v = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    assert torch.allclose(central.clipped(v, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


def test_central_images_are_full_size_one_per_class_and_query() -> None:
    x = torch.rand(60, 1, 28, 28) * 2 - 1
    images, labels = central.central_images(
        x, np.arange(60) % 3, 3, queries=2, clip=8.0, noise_multiplier=5.0, seed=0, augment=1.0
    )
    assert images.shape == (6, 1, 28, 28) and labels.tolist() == [0, 1, 2, 0, 1, 2]
    assert images.min() >= -1 and images.max() <= 1


# ------------------------------------------------------------------ procedural images
def test_procedural_images_are_deterministic_sized_and_of_every_kind() -> None:
    a, b = procedural_images(30, 28, seed=3), procedural_images(30, 28, seed=3)
    assert np.array_equal(a.images, b.images) and a.images.shape == (30, 28, 28)
    assert not np.array_equal(a.images, procedural_images(30, 28, seed=4).images)
    assert sorted(set(a.labels.tolist())) == [0, 1, 2] and a.class_names == list(KINDS)
    assert all(img.max() > 0 for img in a.images)  # nothing blank
    colour = procedural_images(6, 32, seed=0, channels=3)
    assert colour.images.shape == (6, 32, 32, 3)


# ------------------------------------------------------------------ the fit threshold and shared classes
def test_fit_threshold_rejects_classes_no_public_class_fits() -> None:
    noisy = np.array(
        [
            [900.0, 60.0, 40.0],  # row 0: public 0 holds 90%: fits
            [350.0, 330.0, 320.0],  # row 1: spread out, nothing reaches 50%: falls back
            [20.0, 30.0, 950.0],
        ]
    )  # row 2: public 2
    chosen = select_fitting(noisy, 1, fit_threshold=0.5, noise_std=10.0, shared=False)
    assert chosen == [[0], [], [2]]
    assert fit_floor(noisy, 1, 0.5, 10.0).tolist() == [500.0, 500.0, 500.0]
    # today's behaviour (threshold 0) forces a class onto every row
    assert select_fitting(
        noisy, 1, fit_threshold=0.0, noise_std=10.0, shared=False
    ) == select_classes(noisy, 1)


def test_fit_floor_is_at_least_four_noise_stds_so_pure_noise_rarely_fits() -> None:
    rng = np.random.default_rng(0)
    false_fits = 0
    for _ in range(
        200
    ):  # a tiny class (5 images) whose images spread over 10 classes: nothing truly fits
        noisy = np.full((1, 10), 0.5) + rng.normal(0, 10.0, size=(1, 10))
        false_fits += bool(
            select_fitting(noisy, 1, fit_threshold=0.3, noise_std=10.0, shared=True)[0]
        )
    assert false_fits <= 2


def test_shared_classes_let_several_sensitive_classes_use_the_same_public_class() -> None:
    noisy = np.array([[800.0, 100.0, 100.0], [700.0, 200.0, 100.0], [600.0, 300.0, 100.0]])
    assert select_fitting(noisy, 1, fit_threshold=0.5, noise_std=10.0, shared=True) == [
        [0],
        [0],
        [0],
    ]
    # one-to-one: late rows get leftovers that do not fit, so they fall back instead
    assert select_fitting(noisy, 1, fit_threshold=0.5, noise_std=10.0, shared=False) == [
        [0],
        [],
        [],
    ]
    sel = build_selection([[0], [0], []], np.array([0, 1, 0, 2]))
    assert sel.public_index.tolist() == [0, 0, 2, 2] and sel.new_labels.tolist() == [0, 1, 0, 1]
    assert sel.ratio == 0.5
    empty = build_selection([[], [], []], np.array([0, 1]))
    assert len(empty.public_index) == 0


# ------------------------------------------------------------------ end to end, tiny
@pytest.fixture(scope="module")
def data() -> tuple[ImageDataset, ImageDataset]:
    torch.set_num_threads(1)
    sens = load_source("builtin:mnist5k")
    idx = np.concatenate([np.flatnonzero(sens.labels == c)[:12] for c in range(10)])
    pub = uci_digits()
    # 40 public digits a class (all 10 classes): the semantic query's classifier trains an epoch on
    # them in every run (0.9 s on all 1,797)
    pub = pub.subset(np.concatenate([np.flatnonzero(pub.labels == c)[:40] for c in range(10)]))
    return sens.subset(idx), pub


def _store(tmp_path: Path, sens: ImageDataset) -> Store:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    ledger.register_dataset(
        store,
        name="mnist",
        source="test",
        fingerprint="fp",
        record_count=len(sens),
        labels=sens.label_set,
        image_shape=[28, 28],
        epsilon_cap=10.0,
        delta_cap=DELTA,
    )
    return store


def _run(store: Store, sens, pub, cfg: PrivImageConfig, wd: Path, stages: set | None = None):
    b = ledger.budget(store, "mnist")
    plan = registry.get("privimage").plan(cfg, dataset_info(b.dataset), b.history, pub)
    return runner.run_charged(
        store,
        run_id="r",
        dataset="mnist",
        data=sens,
        public=pub,
        mechanism="privimage",
        config=cfg,
        plan=plan,
        workdir=wd,
        progress=(lambda s, d, t: stages.add(s)) if stages is not None else lambda *a: None,
    )


def test_fallback_end_to_end_records_which_classes_fit_and_pretrains_on_procedural_images(
    data, tmp_path
) -> None:
    sens, pub = data
    store = _store(tmp_path, sens)
    # a threshold no class can reach: every class falls back to the procedural prior
    cfg = PrivImageConfig.tiny(
        4.0, DELTA, fit_threshold=1.0, procedural_images=30, share_public_classes=True
    )
    res = _run(store, sens, pub, cfg, tmp_path / "w")
    p = res.parameters
    assert p["fitted_classes"] == [] and len(p["fallback_classes"]) == 10
    assert (
        p["selected_images"] == 0
        and p["fit_threshold"] == 1.0
        and p["share_public_classes"] is True
    )
    assert res.images.shape == (20, 28, 28)
    query, dp = ledger.get_charge(store, "r").charged_events
    assert isinstance(query, GaussianQuery) and isinstance(dp, DpSgd)


def test_central_images_end_to_end_are_charged_saved_and_reused(data, tmp_path) -> None:
    sens, pub = data
    store = _store(tmp_path, sens)
    stages: set[str] = set()
    cfg = PrivImageConfig.tiny(
        4.0,
        DELTA,
        selection="procedural",
        procedural_images=30,
        central_images=2,
        central_sigma=5.0,
        central_steps=2,
    )
    res = _run(store, sens, pub, cfg, tmp_path / "w", stages)
    charged = ledger.get_charge(store, "r").charged_events
    assert charged[0] == GaussianQuery(sigma=5.0 * math.sqrt(2), sensitivity=math.sqrt(2), count=2)
    assert (
        isinstance(charged[1], DpSgd) and len(charged) == 2
    )  # no semantic query with "procedural"
    assert ledger.budget(store, "mnist").spent_rdp <= 4.0 + 1e-9
    p = res.parameters
    assert p["central_images"] == 2 and p["central_noise_std"] == pytest.approx(5.0 * math.sqrt(2))
    saved = central.load(tmp_path / "w")
    assert saved is not None and saved[0].shape == (20, 1, 28, 28)
    assert "pretraining" in stages and "selected_public_classes" not in p


# ------------------------------------------------------------------ the frequency warm-up's charge
def test_the_frequency_embedding_is_planned_between_the_query_and_the_central_images() -> None:
    cfg = PrivImageConfig(epsilon=1.0, delta=1e-5, batch_size=250, central_images=2)
    p = plan_privimage(cfg, 60000, n_classes=10)
    assert p.frequency_event == GaussianQuery(sigma=cfg.frequency_sigma, sensitivity=1.0)
    assert p.query_event is p.events[0] and p.frequency_event is p.events[1]
    assert p.central_event is p.events[2] and isinstance(p.events[3], DpSgd)
    again = type(p).from_json(p.to_json())
    assert (again.query_event, again.frequency_event, again.central_event) == (
        p.query_event,
        p.frequency_event,
        p.central_event,
    )
    alone = plan_privimage(cfg.with_(selection="none", central_images=0), 60000, n_classes=10)
    assert alone.query_event is None and alone.frequency_event is alone.events[0]
    off = plan_privimage(cfg.with_(frequency_warmup=False), 60000, n_classes=10)
    assert off.frequency_event is None and off.noise_multiplier < p.noise_multiplier


@pytest.mark.parametrize(
    ("records", "classes", "on"), [(60000, 10, True), (4000, 10, False), (60000, 100, False)]
)
def test_frequency_warmup_auto_is_decided_from_the_registered_counts(
    records: int, classes: int, on: bool
) -> None:
    cfg = PrivImageConfig(epsilon=1.0, delta=1e-5, batch_size=250, central_images=0)
    assert (plan_privimage(cfg, records, n_classes=classes).frequency_event is not None) is on


# Slow since issue 63 (end to end: a whole run; fast:
# test_the_frequency_embedding_is_planned_between_the_query_and_the_central_images,
# test_central_images_end_to_end_are_charged_saved_and_reused)
@pytest.mark.slow
def test_the_frequency_warmup_end_to_end_is_charged_saved_and_never_asked_again(
    data, tmp_path
) -> None:
    """A run with the warm-up charges its one embedding query, pre-trains on the generator's
    images, and leaves the noisy embedding in its folder; a resumed run finds the embedding there
    and never draws it again (which would release a second answer that nobody charged)."""
    from synth.mechanisms.privimage import frequency
    from synth.tools.kernel import embedding as merf_embedding

    sens, pub = data
    store = _store(tmp_path, sens)
    stages: set[str] = set()
    cfg = PrivImageConfig.tiny(
        4.0, DELTA, selection="none", frequency_warmup=True, frequency_sigma=2.0
    )
    res = _run(store, sens, pub, cfg, tmp_path / "w", stages)
    charged = ledger.get_charge(store, "r").charged_events
    assert charged[0] == GaussianQuery(sigma=2.0, sensitivity=1.0) and isinstance(charged[1], DpSgd)
    assert ledger.budget(store, "mnist").spent_rdp <= 4.0 + 1e-9
    p = res.parameters
    assert p["frequency_warmup"] is True and p["frequency_noise_std"] == 2.0
    assert {
        "frequency warm-up: embedding (one Gaussian query)",
        "frequency warm-up: generator",
    } <= (stages)
    wd = tmp_path / "w"
    first = np.load(wd / frequency.EMBEDDING)["sums"]
    (wd / frequency.IMAGES).unlink()  # as if the run had died after the query, before the images

    def refuse(*args, **kwargs):
        raise AssertionError("the embedding was drawn a second time")

    original = merf_embedding.noisy_embedding
    frequency.draw_embedding = refuse
    try:
        x, y = frequency.warmup_images(
            sens.images,
            np.arange(len(sens)) % 10,
            10,
            charged[0],
            frequency.MerfSettings(256, 105.0, 8, 8, 3, 16, 0.01, 0),
            30,
            wd,
            lambda *a: None,
        )
    finally:
        frequency.draw_embedding = original
    assert np.array_equal(np.load(wd / frequency.EMBEDDING)["sums"], first)
    assert x.shape == (30, 1, 28, 28) and float(x.min()) >= -1 and float(x.max()) <= 1
    assert sorted(set(y.tolist())) == list(range(10))
