"""Class-conditional sampling and SDEdit variations with a DDIM or DPM-Solver++ scheduler, batched,
with progress."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, UNet2DModel
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from synth.mechanisms.privimage.config import SAMPLERS
from synth.mechanisms.privimage.data import to_tensor, to_uint8
from synth.mechanisms.privimage.precision import autocast
from synth.progress import ProgressFn, no_progress


def balanced_labels(n_samples: int, n_classes: int) -> np.ndarray:
    """Class positions 0..C-1, as equal as possible (the first n % C classes get one more)."""
    return np.sort(np.arange(n_samples) % n_classes)


@torch.no_grad()
def sample_images(
    model: torch.nn.Module,
    labels: np.ndarray,
    *,
    image_size: int,
    channels: int,
    train_timesteps: int,
    ddim_steps: int,
    batch: int,
    seed: int,
    device: torch.device,
    progress: ProgressFn = no_progress,
    guidance: float = 0.0,
    precision: str = "float32",
    sampler: str = "ddim",
) -> np.ndarray:
    """uint8 images, one per entry of `labels` (class positions). With `guidance` w > 0,
    classifier-free guidance: eps = (1 + w) eps(x, y) - w eps(x, null), the null class being the
    last class embedding. `precision` (resolved, synth.mechanisms.privimage.precision) is the
    UNet's; the sampler's update stays in float32."""
    gen = torch.Generator().manual_seed(seed)
    model.to(device).eval()
    out = []
    for start in range(0, len(labels), batch):
        sched = scheduler(sampler, train_timesteps, ddim_steps)
        y = torch.from_numpy(labels[start : start + batch]).to(device)
        x = torch.randn((len(y), channels, image_size, image_size), generator=gen).to(device)
        out.append(
            to_uint8(_denoise(model, sched, x, y, sched.timesteps, guidance, device, precision))
        )
        progress("sampling", min(start + batch, len(labels)), len(labels))
    return np.concatenate(out)


@torch.no_grad()
def vary_images(
    model: torch.nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    strength: float,
    copies: int,
    train_timesteps: int,
    ddim_steps: int,
    batch: int,
    seed: int,
    device: torch.device,
    progress: ProgressFn = no_progress,
    guidance: float = 0.0,
    stage: str = "variations",
    precision: str = "float32",
    sampler: str = "ddim",
) -> np.ndarray:
    """`copies` variations of each uint8 image (SDEdit, Meng et al. 2022): diffuse it forward to the
    sampler's first timestep at or below `strength` x T, then denoise with the model under its
    label. Image i's copies are rows i*copies .. i*copies+copies-1. Strength 1 is a fresh sample;
    small strengths keep the image's shape."""
    gen = torch.Generator().manual_seed(seed)
    model.to(device).eval()
    x0_all, y_all = np.repeat(images, copies, 0), np.repeat(labels, copies)
    out = []
    for start in range(0, len(y_all), batch):
        sched = scheduler(sampler, train_timesteps, ddim_steps)
        steps = [t for t in sched.timesteps if t <= strength * train_timesteps]
        steps = steps or [sched.timesteps[-1]]
        x0 = to_tensor(x0_all[start : start + batch])
        y = torch.from_numpy(y_all[start : start + batch]).to(device)
        x = sched.add_noise(x0, torch.randn(x0.shape, generator=gen), steps[0].reshape(1)).to(
            device
        )
        out.append(to_uint8(_denoise(model, sched, x, y, steps, guidance, device, precision)))
        progress(stage, min(start + batch, len(y_all)), len(y_all))
    return np.concatenate(out)


def scheduler(name: str, train_timesteps: int, steps: int) -> SchedulerMixin:
    """A fresh scheduler set to `steps` steps: DDIM (deterministic, one model call a step; its
    predicted clean image clipped to [-1, 1]) or DPM-Solver++ (Lu et al. 2022; second-order
    multistep, as good in about half the steps), whose predicted clean image is held to [-1, 1] by
    dynamic thresholding: without it, a DP-trained model's first steps overshoot and some samples
    come out as noise. Fresh for every batch, because the multistep solver keeps the batch's
    previous model outputs and its step index."""
    if name == "ddim":
        sched = DDIMScheduler(num_train_timesteps=train_timesteps)
    elif name == "dpm-solver++":
        sched = DPMSolverMultistepScheduler(
            num_train_timesteps=train_timesteps,
            algorithm_type="dpmsolver++",
            solver_order=2,
            lower_order_final=True,
            thresholding=True,
            sample_max_value=1.0,
        )
    else:
        raise ValueError(f"unknown sampler {name!r}: one of {', '.join(SAMPLERS)}")
    sched.set_timesteps(steps)
    return sched


def _denoise(
    model: torch.nn.Module,
    sched: SchedulerMixin,
    x: torch.Tensor,
    y: torch.Tensor,
    timesteps,
    guidance: float,
    device: torch.device,
    precision: str = "float32",
) -> torch.Tensor:
    """Scheduler steps from x at timesteps[0] down to timesteps[-1], conditioned on labels y."""
    for t in timesteps:
        with autocast(device, precision):
            eps = _guided_eps(model, x, t.to(device), y, guidance)
        x = sched.step(eps.float(), t, x).prev_sample
    return x


def _guided_eps(
    model: UNet2DModel, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, w: float
) -> torch.Tensor:
    if w <= 0:
        return model(x, t, class_labels=y).sample
    null = torch.full_like(y, model.config.num_class_embeds - 1)
    both = model(torch.cat([x, x]), t, class_labels=torch.cat([y, null])).sample
    cond, uncond = both[: len(x)], both[len(x) :]
    return (1 + w) * cond - w * uncond
