"""DP-MERF: its one query's sensitivity and epsilon checked independently, the generator learning the
classes from the noisy embedding alone, and the `merf` mechanism through the runner."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import norm

from accounting import ledger, trail
from accounting.errors import InvalidParameterError
from accounting.events import GaussianQuery
from release import runner
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import uci_digits
from synth.mechanisms.merf import MerfConfig
from synth.mechanisms.merf.run import MECHANISM
from synth.tools.kernel.embedding import class_sums, frequencies, noisy_embedding
from synth.tools.kernel.fit import MerfSettings, fit

torch.set_num_threads(1)


def _unit_images(n: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_one_record_moves_the_query_by_exactly_its_sensitivity() -> None:
    """Adding a record adds a vector of norm 1 to one class's column: the L2 sensitivity the ledger
    charges (noise std sigma = noise multiplier)."""
    x, rows = _unit_images(41, 0), np.arange(41) % 3
    w = frequencies(64, 128, 8.0, seed=1)
    with_all = class_sums(x, rows, 3, w)
    without_last = class_sums(x[:40], rows[:40], 3, w)
    assert np.linalg.norm(with_all - without_last) == pytest.approx(1.0, abs=1e-9)


def _analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Balle & Wang 2018: the exact epsilon of a Gaussian mechanism with mu = sensitivity / sigma,
    found by bisection on delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        d = norm.cdf(-mid / mu + mu / 2) - math.exp(mid) * norm.cdf(-mid / mu - mu / 2)
        lo, hi = (mid, hi) if d > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 10.0])
def test_the_planned_noise_keeps_epsilon_under_the_target_by_an_independent_account(
    epsilon: float,
) -> None:
    """The plan calibrates by RDP (dp-accounting); the analytic Gaussian epsilon of the same noise,
    computed here from the normal CDF alone, must be at most the target (RDP is the looser one)."""
    info = registry.DatasetInfo("d", "d", 60_000, tuple(range(10)), (28, 28), 1e-5)
    alone = {"teacher_labels": False}  # the query alone (with DP labels: test_merf_teacher.py)
    plan = MECHANISM.plan(MerfConfig(epsilon, 1e-5, **alone), info, [], uci_digits())
    (event,) = plan.events
    assert isinstance(event, GaussianQuery) and event.sensitivity == 1.0 and event.count == 1
    exact = _analytic_gaussian_epsilon(1.0 / event.sigma, 1e-5)
    assert exact <= epsilon and exact > 0.6 * epsilon  # conservative, not absurdly so
    more = MECHANISM.plan(
        MerfConfig(epsilon, 1e-5, **alone), info, [GaussianQuery(40.0)], uci_digits()
    )
    assert more.events[0].sigma > event.sigma  # prior spend leaves less: more noise


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_features": 101}, "even number"),
        ({"n_features": 10**9}, "even number"),
        ({"lr": float("nan")}, "lr"),
        ({"width": 7}, "width"),
        ({"steps": 0}, "steps"),
        ({"steps": "soon"}, "steps"),
        ({"epsilon": -1}, "epsilon"),
        ({"epsilon": 1e308}, "above 1000"),
        ({"delta": 2.0}, "delta"),
        ({"seed": -3}, "seed"),
    ],
)
def test_bad_settings_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        MerfConfig(**{"epsilon": 1.0, "delta": 1e-5, **overrides})


def test_the_generator_learns_each_class_from_the_noisy_embedding_alone() -> None:
    """Two classes, a bright left half and a bright right half: trained only against the noisy
    embedding (epsilon ~ 10 here), the generator draws each class's half brighter."""
    n = 400
    images = np.zeros((n, 8, 8), np.uint8)
    rows = np.arange(n) % 2
    images[rows == 0, :, :4] = 220
    images[rows == 1, :, 4:] = 220
    s = MerfSettings(
        n_features=512, bandwidth=8.0, z_dim=8, width=8, steps=150, batch=64, lr=0.01, seed=0
    )
    fitted = fit(images, rows, 2, sigma=0.5, s=s)
    assert fitted.embedding.proportions() == pytest.approx([0.5, 0.5], abs=0.05)
    drawn = fitted.draw(np.repeat([0, 1], 50), seed=3, out_size=(8, 8)).astype(float)
    left, right = drawn[:, :, :4].mean(axis=(1, 2)), drawn[:, :, 4:].mean(axis=(1, 2))
    assert (left[:50] > right[:50]).mean() > 0.9 and (right[50:] > left[50:]).mean() > 0.9


def test_the_noise_is_fresh_each_time() -> None:
    x, rows = _unit_images(20, 0), np.arange(20) % 2
    w = frequencies(64, 64, 8.0, seed=0)
    a, b = (noisy_embedding(x, rows, 2, w, sigma=1.0) for _ in range(2))
    assert not np.allclose(a.sums, b.sums)


@pytest.mark.smoke
def test_a_merf_release_through_the_runner_is_charged_its_one_query(
    mnist200_store, tmp_path
) -> None:
    st, sensitive = mnist200_store
    cfg = MerfConfig.tiny(2.0, 1e-5, n_samples=30)
    public = uci_digits()
    b = ledger.budget(st, "mnist")
    plan = MECHANISM.plan(cfg, dataset_info(b.dataset), b.history, public)
    assert plan.guarantee_kind == "dp" and plan.expected_count == 30
    assert any("mostly noise" in w for w in plan.warnings)  # 20 images a class at epsilon 2
    stages: list[str] = []
    res = runner.run_charged(
        st,
        run_id="m1",
        dataset="mnist",
        data=sensitive,
        public=public,
        mechanism="merf",
        config=cfg,
        plan=plan,
        workdir=tmp_path / "w",
        actor="alice",
        progress=lambda s, d, t: stages.append(s),
    )
    assert res.images.shape == (30, 28, 28) and res.images.dtype == np.uint8
    assert sorted(set(res.labels.tolist())) == list(range(10))
    assert {"DP-MERF embedding (one Gaussian query)", "DP-MERF generator"} <= set(stages)
    charge = ledger.get_charge(st, "m1")
    assert charge.state == "committed" and tuple(charge.charged_events) == plan.events
    assert ledger.budget(st, "mnist").spent_rdp <= 2.0
    assert trail.verify(st).ok
    loss = MECHANISM.loss_function(res.output.generator)
    scores = loss(sensitive.images[:10], sensitive.labels[:10])
    assert scores.shape == (10,) and np.isfinite(scores).all()
    about = registry.describe("merf", res.parameters, res.guarantee.as_dict(), 30)
    assert "DP-MERF" in about.what and "never saw an image" in about.what
    # the kernel the plan showed is the one the run used (a noisy query here: the wide one)
    assert res.parameters["bandwidth"] == plan.detail["bandwidth"] == 105.0
    # "auto" decided against DP labels for 20 records a class: the query alone, and it says so
    assert res.parameters["teacher_labels"] is False
    assert res.parameters["teacher_labels_setting"] == "auto"
    assert "two events" not in about.guarantee
    assert res.parameters["steps"] == 5 and "steps_setting" not in res.parameters  # as set
    saved = json.loads((Path(res.output.generator) / "settings.json").read_text())
    assert saved["bandwidth"] == 105.0  # the audit's membership loss rebuilds the same features


@pytest.mark.parametrize(
    ("sigma", "n_records", "bandwidth"),
    [
        (4.43, 55_000, 10.0),  # Fashion-MNIST at epsilon 1 (DPImageBench's split): narrow
        (0.53, 4_000, 10.0),  # MNIST-5k at epsilon 10: narrow
        (4.05, 4_000, 105.0),  # MNIST-5k at epsilon 1: the narrow kernel collapsed; wide
        (26.6, 55_000, 105.0),  # PrivImage's frequency warm-up (FETA-Pro's sigma): wide
    ],
)
def test_the_kernel_is_chosen_from_the_noise_on_a_class_embedding(
    sigma: float, n_records: int, bandwidth: float
) -> None:
    cfg = MerfConfig(1.0, 1e-5)  # n_features 4000
    assert cfg.bandwidth_for(784, sigma, n_records, 10) == pytest.approx(bandwidth)
    assert cfg.bandwidth_for(3 * 784, sigma, n_records, 10) == pytest.approx(3 * bandwidth)
    fixed = MerfConfig(1.0, 1e-5, bandwidth=42.0)
    assert fixed.bandwidth_for(784, sigma, n_records, 10) == 42.0


def test_a_spec_table_without_epsilon_is_refused() -> None:
    info = registry.DatasetInfo("d", "d", 100, (0, 1), (28, 28), 1e-5)
    with pytest.raises(InvalidParameterError, match="needs `epsilon`"):
        MECHANISM.make_config({"steps": 10}, info, None, "default")
    with pytest.raises(InvalidParameterError, match="Unknown \\[merf\\]"):
        MECHANISM.make_config({"epsilon": 1.0, "stepz": 10}, info, None, "default")


def test_several_bandwidths_make_the_features_of_their_mixture_kernel() -> None:
    """Independent check of the random-feature map: phi(x) . phi(y) approximates the kernel
    exp(-|x - y|^2 / (2 bandwidth)) for one bandwidth, and the equal mixture of the kernels for
    several; every phi(x) keeps norm 1 (the query's sensitivity does not change)."""
    from synth.tools.kernel.embedding import features

    torch.manual_seed(0)
    x = torch.rand(6, 64)
    d2 = torch.cdist(x, x).double() ** 2
    for bandwidth, kernel in (
        (4.0, torch.exp(-d2 / 8.0)),
        ((1.0, 20.0), 0.5 * torch.exp(-d2 / 2.0) + 0.5 * torch.exp(-d2 / 40.0)),
    ):
        phi = features(x, frequencies(64, 40_000, bandwidth, seed=3)).double()
        assert torch.allclose(phi.norm(dim=1), torch.ones(6, dtype=torch.float64), atol=1e-5)
        assert (phi @ phi.T - kernel).abs().max() < 0.03
    # one bandwidth draws the same frequencies as before mixtures existed
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(frequencies(64, 10, 4.0, 3), torch.randn(5, 64, generator=gen) / 2.0)


def _quadrants(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Four classes: one bright quadrant each."""
    images = np.zeros((n, 8, 8), np.uint8)
    rows = np.arange(n) % 4
    for c, (r, k) in enumerate(((0, 0), (0, 4), (4, 0), (4, 4))):
        images[rows == c, r : r + 4, k : k + 4] = 220
    return images, rows


_SMALL = MerfSettings(
    n_features=512, bandwidth=8.0, z_dim=8, width=8, steps=150, batch=64, lr=0.01, seed=0
)


def test_a_class_the_generator_lost_is_found_from_the_noisy_embedding_alone() -> None:
    """The check behind retraining: a generator whose class 2 draws garbage (its class embedding
    overwritten, as a collapsed class looks) is flagged for that class only, from the noisy query."""
    from synth.tools.kernel import fit as fit_module

    images, rows = _quadrants()
    fitted = fit(images, rows, 4, sigma=0.5, s=_SMALL)
    assert fitted.attempts == 1 and fitted.distances is not None
    assert fit_module.collapsed_classes(fitted.distances) == []
    with torch.no_grad():
        fitted.generator.embed.weight[2] = 40.0 * torch.randn(_SMALL.z_dim)
        fitted.generator.fc.weight.mul_(4.0)
    d = fit_module.class_distances(
        fitted.generator, fitted.embedding, fitted.frequencies, fitted.size, seed=2
    )
    assert fit_module.collapsed_classes(d) == [2], d


def test_a_collapsed_class_trains_another_generator_and_keeps_the_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every class counted as collapsed (ratio 0), all GENERATOR_ATTEMPTS are trained and the
    kept generator is the one whose worst class is closest to its target; each attempt is a new
    initialisation, so the attempts differ."""
    from synth.tools.kernel import fit as fit_module

    images, rows = _quadrants()
    seen: list[float] = []
    real = fit_module.class_distances

    def recorded(*args, **kwargs):
        d = real(*args, **kwargs)
        seen.append(float(d.max() / np.median(d)))
        return d

    monkeypatch.setattr(fit_module, "COLLAPSE_RATIO", 0.0)
    monkeypatch.setattr(fit_module, "class_distances", recorded)
    fitted = fit(images, rows, 4, sigma=0.5, s=_SMALL)
    assert fitted.attempts == fit_module.GENERATOR_ATTEMPTS == len(seen)
    assert len(set(seen)) == len(seen)
    kept = fitted.distances.max() / np.median(fitted.distances)
    assert kept == pytest.approx(min(seen))


def test_a_collapse_only_the_extra_check_sees_trains_another_generator() -> None:
    """The DP classifier's check (`also_collapsed`) counts like the distance check: a first
    generator it flags is replaced by the next attempt, which it passes; where it flags every
    attempt, the kept one has the fewest flagged classes and the release says which remain."""
    images, rows = _quadrants()
    calls: list[int] = []

    def first_is_broken(gen) -> list[int]:
        calls.append(1)
        return [3] if len(calls) == 1 else []

    fitted = fit(images, rows, 4, sigma=0.5, s=_SMALL, also_collapsed=first_is_broken)
    assert fitted.attempts == 2 and fitted.collapsed == () and len(calls) == 2
    flags = iter([[0, 1], [2], [1, 3]])
    fitted = fit(images, rows, 4, sigma=0.5, s=_SMALL, also_collapsed=lambda gen: next(flags))
    assert fitted.attempts == 3 and fitted.collapsed == (2,)


def test_a_generator_that_drew_noise_for_every_class_is_collapsed_in_every_class() -> None:
    """Against the median alone a total collapse looks even (width 32 at epsilon 10 measured
    1.00-1.06 for all ten classes); a distance near the target's whole norm is a collapse itself."""
    from synth.tools.kernel.fit import collapsed_classes

    assert collapsed_classes(np.array([1.003, 1.011, 0.997, 1.06])) == [0, 1, 2, 3]
    assert collapsed_classes(np.array([0.16, 0.42, 0.3, 0.25])) == []
    assert collapsed_classes(np.array([0.25, 0.3, 0.76, 0.22])) == [2]  # 2.9x the median


def test_the_run_reads_the_approved_plans_decisions_instead_of_deciding_again(
    mnist200_store, tmp_path
) -> None:
    """The plan decides the kernel, perceptual share and steps once; the run takes them from the
    plan it was given (here one whose steps differ from what the config would decide), and a plan
    that does not record them is refused before the data is read, its charge refunded."""
    import dataclasses

    st, sensitive = mnist200_store
    cfg = MerfConfig.tiny(2.0, 1e-5, n_samples=20)
    public = uci_digits()
    b = ledger.budget(st, "mnist")
    plan = MECHANISM.plan(cfg, dataset_info(b.dataset), b.history, public)
    assert plan.detail["steps"] == 5
    approved = dataclasses.replace(plan, detail={**plan.detail, "steps": 3})

    def run(run_id: str, mplan: registry.MechanismPlan) -> runner.RunResult:
        return runner.run_charged(
            st,
            run_id=run_id,
            dataset="mnist",
            data=sensitive,
            public=public,
            mechanism="merf",
            config=cfg,
            plan=mplan,
            workdir=tmp_path / run_id,
            actor="alice",
        )

    assert run("decided", approved).parameters["steps"] == 3
    older = dataclasses.replace(
        plan, detail={k: v for k, v in plan.detail.items() if k != "perceptual_share"}
    )
    with pytest.raises(InvalidParameterError, match="perceptual_share.*Plan and approve"):
        run("older", older)
    assert ledger.get_charge(st, "older").state == "refunded"
