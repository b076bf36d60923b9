"""Class-conditional sampling with a DDIM scheduler, batched, with progress."""
from __future__ import annotations

import numpy as np
import torch
from diffusers import DDIMScheduler

from synth.privimage.data import to_uint8
from synth.progress import ProgressFn, no_progress


def balanced_labels(n_samples: int, n_classes: int) -> np.ndarray:
    """Class positions 0..C-1, as equal as possible (the first n % C classes get one more)."""
    return np.sort(np.arange(n_samples) % n_classes)


@torch.no_grad()
def sample_images(model: torch.nn.Module, labels: np.ndarray, *, image_size: int, channels: int, train_timesteps: int,
                  ddim_steps: int, batch: int, seed: int, device: torch.device,
                  progress: ProgressFn = no_progress, guidance: float = 0.0) -> np.ndarray:
    """uint8 images, one per entry of `labels` (class positions). With `guidance` w > 0, classifier-free
    guidance: eps = (1 + w) eps(x, y) - w eps(x, null), the null class being the last class embedding."""
    sched = DDIMScheduler(num_train_timesteps=train_timesteps)
    sched.set_timesteps(ddim_steps)
    gen = torch.Generator().manual_seed(seed)
    model.to(device).eval()
    out = []
    for start in range(0, len(labels), batch):
        y = torch.from_numpy(labels[start:start + batch]).to(device)
        x = torch.randn((len(y), channels, image_size, image_size), generator=gen).to(device)
        for t in sched.timesteps:
            eps = _guided_eps(model, x, t.to(device), y, guidance)
            x = sched.step(eps, t, x).prev_sample
        out.append(to_uint8(x))
        progress("sampling", min(start + batch, len(labels)), len(labels))
    return np.concatenate(out)


def _guided_eps(model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, w: float) -> torch.Tensor:
    if w <= 0:
        return model(x, t, class_labels=y).sample
    null = torch.full_like(y, model.config.num_class_embeds - 1)
    both = model(torch.cat([x, x]), t, class_labels=torch.cat([y, null])).sample
    cond, uncond = both[:len(x)], both[len(x):]
    return (1 + w) * cond - w * uncond
