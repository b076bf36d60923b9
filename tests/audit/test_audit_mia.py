"""Membership inference: high AUC on a deliberately overfitted tiny diffusion model, ~0.5 on
independent data, and a contradiction flag when the empirical epsilon exceeds the claim."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from audit.mia import attack_stats, run_mia
from audit.policy import AuditPolicy
from synth.kinds.datasets import ImageDataset, load_source, uci_digits


def _small(images: np.ndarray) -> torch.Tensor:
    """uint8 28x28 -> [-1, 1] 16x16 (keeps the model tiny and the test fast)."""
    x = torch.from_numpy(images).float()[:, None] / 127.5 - 1
    return F.interpolate(x, size=16, mode="bilinear", align_corners=False)


@pytest.fixture(scope="module")
def overfitted():
    from diffusers import DDPMScheduler, UNet2DModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sens = load_source("builtin:mnist5k")
    rng = np.random.default_rng(0)
    idx = rng.choice(len(sens), 8 + 96, replace=False)
    members, unseen = sens.subset(idx[:8]), sens.subset(idx[8:])
    net = UNet2DModel(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(16, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )
    sched = DDPMScheduler(num_train_timesteps=100)
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    x = _small(members.images)
    for _ in range(200):  # deliberately overfit 8 images
        t = torch.randint(0, 100, (len(x),))
        noise = torch.randn_like(x)
        loss = F.mse_loss(net(sched.add_noise(x, noise, t), t).sample, noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()

    @torch.no_grad()
    def loss_fn(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Per-sample diffusion loss at fixed timesteps and a fixed noise seed."""
        x = _small(images)
        gen = torch.Generator().manual_seed(123)
        total = torch.zeros(len(x))
        for step in (2, 5, 5, 10, 10, 20, 20, 30, 40):
            noise = torch.randn(x.shape, generator=gen)
            t = torch.full((len(x),), step)
            total += ((net(sched.add_noise(x, noise, t), t).sample - noise) ** 2).mean((1, 2, 3))
        return total.numpy()

    return loss_fn, members, unseen


def test_mia_detects_overfitted_generator(overfitted, tmp_path):
    loss_fn, members, unseen = overfitted
    stats = attack_stats(
        -loss_fn(members.images, members.labels), -loss_fn(unseen.images, unseen.labels)
    )
    assert stats["auc"] > 0.8, stats["auc"]
    res = run_mia(
        loss_fn,
        members,
        unseen,
        claimed_epsilon=1.0,
        delta=1e-5,
        policy=AuditPolicy(mia_samples=8),
        artifacts_dir=tmp_path,
    )
    assert res.passed is False and res.details["auc"] > 0.8
    assert "max 0.6" in res.summary
    assert (tmp_path / "mia_roc.png").stat().st_size > 1000


def test_mia_near_chance_on_independent_data(overfitted):
    loss_fn, _, unseen = overfitted
    a, b = unseen.subset(np.arange(48)), unseen.subset(np.arange(48, 96))
    stats = attack_stats(-loss_fn(a.images, a.labels), -loss_fn(b.images, b.labels))
    assert abs(stats["auc"] - 0.5) < 0.2, stats["auc"]
    res = run_mia(
        loss_fn,
        a,
        b,
        claimed_epsilon=1.0,
        delta=1e-5,
        policy=AuditPolicy(mia_samples=48),
        artifacts_dir=None,
    )
    assert res.details["contradiction"] is False


def test_contradiction_flagged_when_empirical_epsilon_exceeds_claim():
    data = uci_digits()
    members, non = data.subset(np.arange(0, 1000, 2)), data.subset(np.arange(1, 1000, 2))
    seen = {im.tobytes() for im in members.images}
    rng = np.random.default_rng(0)

    def leaky_loss(images, labels):  # a generator that memorised exactly its training images
        return np.array(
            [0.0 if im.tobytes() in seen else 1.0 for im in images]
        ) + 0.01 * rng.random(len(images))

    res = run_mia(
        leaky_loss,
        members,
        non,
        claimed_epsilon=1.0,
        delta=1e-5,
        policy=AuditPolicy(),
        artifacts_dir=None,
    )
    assert res.details["contradiction"] is True and res.passed is False
    assert res.details["epsilon_bound"]["eps_lower"] > 1.0
    assert "CONTRADICTS" in res.summary
    # the same attack against a claim it cannot refute
    res = run_mia(
        leaky_loss,
        members,
        non,
        claimed_epsilon=50.0,
        delta=1e-5,
        policy=AuditPolicy(mia_max_auc=1.0, mia_max_tpr_at_1pct_fpr=1.0),
        artifacts_dir=None,
    )
    assert res.details["contradiction"] is False and res.passed is True


def test_bad_loss_fn_output_raises():
    from accounting.errors import InvalidParameterError

    d = ImageDataset(np.zeros((8, 28, 28), np.uint8), np.zeros(8))
    with pytest.raises(InvalidParameterError):
        run_mia(lambda x, y: np.full(len(x), np.nan), d, d, 1.0, 1e-5, AuditPolicy(), None)
    with pytest.raises(InvalidParameterError):
        run_mia(lambda x, y: np.zeros(3), d, d, 1.0, 1e-5, AuditPolicy(), None)
