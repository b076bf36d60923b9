"""The diffusion samplers: DDIM and DPM-Solver++ land on the data an exact denoiser knows, take the
steps they are set to, and do not carry one batch's solver state into the next."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from accounting.errors import InvalidParameterError
from synth.mechanisms.privimage import PrivImageConfig
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.sampling import scheduler, sample_images, vary_images

T = 1000
VARYING = dict(train_timesteps=T, batch=4, device=torch.device("cpu"))
SAMPLING = dict(VARYING, image_size=8, channels=1)


class ExactDenoiser(torch.nn.Module):
    """The noise prediction that is exact when every training image is `target`: at timestep t,
    x_t = sqrt(abar_t) target + sqrt(1 - abar_t) eps, so eps = (x_t - sqrt(abar_t) target) /
    sqrt(1 - abar_t). A sampler that is wired right lands on `target` from any start."""

    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.target = target
        self.abar = scheduler("ddim", T, 10).alphas_cumprod
        self.config = SimpleNamespace(num_class_embeds=3)
        self.calls = 0

    def forward(self, x: torch.Tensor, t: torch.Tensor, class_labels: torch.Tensor):
        self.calls += 1
        a = self.abar[int(t)]
        return SimpleNamespace(sample=(x - a.sqrt() * self.target) / (1 - a).sqrt())


def _target() -> torch.Tensor:
    ramp = torch.linspace(-0.9, 0.9, 64).reshape(1, 1, 8, 8)
    return ramp.transpose(2, 3) * (ramp > 0)


@pytest.mark.parametrize("sampler,steps", [("ddim", 25), ("dpm-solver++", 12), ("dpm-solver++", 8)])
def test_sampling_and_variations_land_on_what_an_exact_denoiser_knows(
    sampler: str, steps: int
) -> None:
    target = _target()
    want = ((target[0, 0] + 1) * 127.5).round().numpy()
    model = ExactDenoiser(target)
    labels = np.array([0, 1, 0, 1, 0, 1])
    images = sample_images(
        model, labels, ddim_steps=steps, seed=3, sampler=sampler, **SAMPLING
    ).astype(float)
    assert images.shape == (6, 8, 8)
    assert np.abs(images - want).max() <= 1.0
    # two of six in a batch of four: the solver takes `steps` model calls a batch, no more
    assert model.calls == 2 * steps
    start = np.zeros((2, 8, 8), np.uint8)
    varied = vary_images(
        model,
        start,
        labels[:2],
        strength=0.4,
        copies=2,
        ddim_steps=steps,
        seed=4,
        sampler=sampler,
        **VARYING,
    ).astype(float)
    assert np.abs(varied - want).max() <= 1.0


def test_a_variation_takes_only_the_steps_below_its_strength() -> None:
    model = ExactDenoiser(_target())
    vary_images(
        model,
        np.zeros((1, 8, 8), np.uint8),
        np.array([0]),
        strength=0.4,
        copies=1,
        ddim_steps=12,
        seed=0,
        sampler="dpm-solver++",
        **VARYING,
    )
    below = [t for t in scheduler("dpm-solver++", T, 12).timesteps if t <= 0.4 * T]
    assert model.calls == len(below) == 4


def test_dpm_solver_starts_every_batch_afresh() -> None:
    """The multistep solver remembers the previous model outputs and its step index: a solver
    shared by two batches would continue the first batch's trajectory in the second. The same
    seed in batches of 2 or of 6 draws the same starting noise, so the images must agree."""
    torch.manual_seed(0)
    model = make_unet(8, 1, 2, (8, 16), 1)
    labels = np.array([0, 1, 0, 1, 0, 1])
    kw = dict(SAMPLING, ddim_steps=6, seed=5, sampler="dpm-solver++")
    whole = sample_images(model, labels, **{**kw, "batch": 6}).astype(int)
    pairs = sample_images(model, labels, **{**kw, "batch": 2}).astype(int)
    assert np.abs(whole - pairs).max() <= 1


def test_config_refuses_an_unknown_sampler() -> None:
    with pytest.raises(
        InvalidParameterError,
        match='sampler must be one of "ddim", "dpm-solver\\+\\+", got "euler"',
    ):
        PrivImageConfig(epsilon=1.0, delta=1e-5, sampler="euler")
    with pytest.raises(ValueError, match="unknown sampler 'heun'"):
        scheduler("heun", T, 10)
