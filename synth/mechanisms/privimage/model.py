"""The class-conditional diffusion model (diffusers UNet2DModel) and its DDPM loss.

No attention blocks: opacus' per-sample gradient hooks cover Conv2d, Linear, GroupNorm and
Embedding, which is all this UNet uses. Class index C (one past the last class) is a "null" class
used for unconditional pre-training (PDP-Diffusion-style baseline)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from diffusers import DDPMScheduler, UNet2DModel

from accounting.errors import DataFormatError
from synth.mechanisms.privimage.data import label_index, to_format, to_tensor

META_FILE = "privimage_meta.json"


def make_unet(
    image_size: int, channels: int, n_classes: int, widths: Sequence[int], layers_per_block: int
) -> UNet2DModel:
    n = len(widths)
    return UNet2DModel(
        sample_size=image_size,
        in_channels=channels,
        out_channels=channels,
        block_out_channels=tuple(widths),
        layers_per_block=layers_per_block,
        down_block_types=("DownBlock2D",) * n,
        up_block_types=("UpBlock2D",) * n,
        norm_num_groups=8,
        num_class_embeds=n_classes + 1,
        add_attention=False,
    )


def make_scheduler(train_timesteps: int) -> DDPMScheduler:
    return DDPMScheduler(num_train_timesteps=train_timesteps)


def ddpm_loss(
    model: torch.nn.Module,
    scheduler: DDPMScheduler,
    x0: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    t_min: float = 0.0,
) -> torch.Tensor:
    """Each image's noise-prediction MSE (mean over its pixels), reduced over the batch by
    `reduction`: "mean", or "sum" (the DP backward pass, see training.HOOKS_LOSS_REDUCTION).
    Timesteps are uniform on [t_min * T, T)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    noise = torch.randn(x0.shape, generator=generator, device=x0.device)
    steps = scheduler.config.num_train_timesteps
    t = torch.randint(int(t_min * steps), steps, (len(x0),), generator=generator, device=x0.device)
    x_t = scheduler.add_noise(x0, noise, t)
    pred = model(x_t, t, class_labels=y).sample
    loss = ((pred - noise) ** 2).mean()
    return loss * len(x0) if reduction == "sum" else loss


def save_model(
    model: UNet2DModel,
    path: Path,
    *,
    label_values: list[int],
    class_names: list[str],
    image_size: int,
    channels: int,
    train_timesteps: int,
) -> Path:
    model.save_pretrained(str(path))
    meta = {
        "label_values": [int(v) for v in label_values],
        "class_names": list(class_names),
        "image_size": image_size,
        "channels": channels,
        "train_timesteps": train_timesteps,
    }
    (path / META_FILE).write_text(json.dumps(meta, indent=1))
    return path


def load_model(path: Path | str) -> tuple[UNet2DModel, dict]:
    path = Path(path)
    if not (path / META_FILE).exists():
        raise DataFormatError(
            f"{path}: not a PrivImage model folder (no {META_FILE}); pass the release's saved "
            "model folder (MechanismOutput.generator)."
        )
    # no `accelerate` install hint
    model = UNet2DModel.from_pretrained(str(path), low_cpu_mem_usage=False)
    return model.eval(), json.loads((path / META_FILE).read_text())


@torch.no_grad()
def per_sample_diffusion_loss(
    model_path_or_model: str | Path | UNet2DModel | tuple[UNet2DModel, dict],
    images_uint8: np.ndarray,
    labels: np.ndarray,
    timesteps: Sequence[int] | None = None,
    n_noise: int = 2,
    seed: int = 0,
    batch_size: int = 256,
    train_timesteps: int = 1000,
) -> np.ndarray:
    """Mean DDPM noise-prediction MSE of each image over fixed timesteps and fixed noise draws
    (deterministic: the noise for image i depends only on seed, i, the timestep and the draw).
    Default timesteps: 1%, 5%, 10%, 20% and 40% of the training horizon (10..400 of 1000).
    Lower loss on training members is what a loss-threshold membership-inference attack exploits.
    Give the saved model folder (MechanismOutput.generator); a bare UNet2DModel is also
    accepted (labels then are class positions, and `train_timesteps` must match its training)."""
    model, meta = _loss_model(model_path_or_model, train_timesteps)
    labels = np.asarray(labels)
    timesteps = _loss_timesteps(timesteps, meta["train_timesteps"])
    if len(labels) != len(images_uint8):
        raise DataFormatError(f"{len(images_uint8)} images but {len(labels)} labels.")
    bad = [t for t in timesteps if not 0 <= int(t) < meta["train_timesteps"]]
    if bad or n_noise < 1:
        raise DataFormatError(
            f"timesteps must lie in [0, {meta['train_timesteps']}) "
            f"and n_noise >= 1; got {bad}, {n_noise}."
        )
    device = next(model.parameters()).device
    sched = make_scheduler(meta["train_timesteps"])
    x = to_tensor(to_format(np.asarray(images_uint8), meta["image_size"], meta["channels"]))
    y = torch.from_numpy(label_index(labels, meta["label_values"]))
    out = np.zeros(len(x), dtype=np.float64)
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        for ti, t in enumerate(timesteps):
            for r in range(n_noise):
                noise = _fixed_noise(xb, seed, start, ti, r).to(device)
                tt = torch.full((len(xb),), int(t), dtype=torch.long, device=device)
                pred = model(sched.add_noise(xb, noise, tt), tt, class_labels=yb).sample
                out[start : start + len(xb)] += (
                    ((pred - noise) ** 2).flatten(1).mean(1).double().cpu().numpy()
                )
    return out / (len(timesteps) * n_noise)


def _loss_model(
    model_path_or_model: str | Path | UNet2DModel | tuple[UNet2DModel, dict],
    train_timesteps: int,
) -> tuple[UNet2DModel, dict]:
    """The model and its metadata: given as a pair, a bare UNet (labels are class positions
    0..C-1), or a saved model folder."""
    if isinstance(model_path_or_model, tuple):
        return model_path_or_model
    if isinstance(model_path_or_model, UNet2DModel):
        model, cfg = model_path_or_model.eval(), model_path_or_model.config
        meta = {
            "label_values": list(range(cfg.num_class_embeds - 1)),
            "image_size": cfg.sample_size,
            "channels": cfg.in_channels,
            "train_timesteps": train_timesteps,
        }
        return model, meta
    return load_model(model_path_or_model)


def _loss_timesteps(timesteps: Sequence[int] | None, T: int) -> list[int]:
    """The given timesteps, or by default 1%, 5%, 10%, 20% and 40% of the training horizon."""
    return (
        [max(1, T // 100), T // 20, T // 10, T // 5, 2 * T // 5]
        if timesteps is None
        else list(timesteps)
    )


def _fixed_noise(xb: torch.Tensor, seed: int, start: int, ti: int, r: int) -> torch.Tensor:
    """Draw `r` of timestep `ti` for the batch starting at `start`: image i's noise depends only
    on (seed, i, ti, r), whatever the batch size."""
    return torch.stack(
        [
            torch.randn(
                xb.shape[1:],
                generator=torch.Generator().manual_seed(
                    hash((seed, start + i, ti, r)) & 0x7FFFFFFF
                ),
            )
            for i in range(len(xb))
        ]
    )
