"""Augmentation of PUBLIC images for pre-training (no privacy cost).

The public prior decides how good a DP fine-tune can be: the 1,797 UCI digits are 8x8 scans,
upsampled, so they all share one stroke width, slant and size. Random affine maps (scale, rotation,
shear, shift) and random stroke thickness (grey-scale dilation/erosion) widen that prior; elastic
distortion (Simard et al. 2003) bends the strokes, and a contrast curve sharpens the blur that
upsampling 8x8 scans leaves. Measured on MNIST-5k (the small CNN, 40 epochs on 1,797 augmented UCI
digits, 2 seeds): affine + thickness 0.672, with elastic distortion and sharpening 0.727. Yet a
diffusion model pre-trained on the latter draws blobbier digits (BENCHMARKS.md, "PrivImage recipe"),
so pre-training leaves them off unless `pretrain_elastic` is set."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def augment_public(
    x: torch.Tensor,
    gen: torch.Generator,
    strength: float = 1.0,
    *,
    elastic: bool = False,
    sharpen: bool = False,
) -> torch.Tensor:
    """Randomly transformed copy of a batch x (N,C,H,W) in [-1, 1] with a black (-1) background.

    strength 0 returns x unchanged; 1 means scale +-15%, rotation +-14 deg, shear +-0.2, shift
    +-10%, 30% of images thickened and 20% thinned by a 3x3 grey-scale dilation/erosion, then (if
    asked) an elastic distortion of up to 2 px and a sharpening contrast curve."""
    if strength <= 0:
        return x
    x = _affine_and_thickness(x, gen, strength)
    if elastic:
        x = _elastic(x, gen, max_shift_px=2.0 * strength)
    return _sharpen(x) if sharpen else x


def _affine_and_thickness(x: torch.Tensor, gen: torch.Generator, strength: float) -> torch.Tensor:
    n = len(x)
    u = torch.rand(n, 6, generator=gen)
    scale = 1 + (u[:, 0] - 0.5) * 0.3 * strength
    angle = (u[:, 1] - 0.5) * 0.5 * strength
    shear = (u[:, 4] - 0.5) * 0.4 * strength
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [
            torch.stack([cos, -sin + shear, (u[:, 2] - 0.5) * 0.2 * strength], 1),
            torch.stack([sin, cos, (u[:, 3] - 0.5) * 0.2 * strength], 1),
        ],
        1,
    ).to(x)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x + 1, grid, align_corners=False, padding_mode="zeros") - 1  # pad with black
    thick = (u[:, 5] < 0.3 * strength).to(x.device)[:, None, None, None]
    thin = (u[:, 5] > 1 - 0.2 * strength).to(x.device)[:, None, None, None]
    dilated = F.max_pool2d(x, 3, 1, 1)
    eroded = -F.max_pool2d(-x, 3, 1, 1)
    return torch.where(thick, dilated, torch.where(thin, eroded, x))


def _elastic(
    x: torch.Tensor, gen: torch.Generator, max_shift_px: float, smooth_px: float = 3.0
) -> torch.Tensor:
    """Displace every pixel by a random field smoothed with a Gaussian of `smooth_px` (Simard et al.
    2003)."""
    n, _, h, w = x.shape
    field = torch.rand(n * 2, 1, h, w, generator=gen) * 2 - 1
    r = torch.arange(int(4 * smooth_px) | 1) - int(4 * smooth_px) // 2
    kernel = torch.exp(-(r.float() ** 2) / (2 * smooth_px**2))
    kernel = kernel / kernel.sum()
    field = F.conv2d(field, kernel.view(1, 1, 1, -1), padding=(0, len(r) // 2))
    field = F.conv2d(field, kernel.view(1, 1, -1, 1), padding=(len(r) // 2, 0)).view(n, 2, h, w)
    field = (
        field / field.abs().amax(dim=(2, 3), keepdim=True).clamp_min(1e-6) * (2 * max_shift_px / h)
    )
    identity = F.affine_grid(torch.eye(2, 3).expand(n, 2, 3), [n, 1, h, w], align_corners=False)
    grid = (identity + field.permute(0, 2, 3, 1)).to(x)
    return F.grid_sample(x + 1, grid, align_corners=False, padding_mode="zeros") - 1


def _sharpen(x: torch.Tensor, gain: float = 6.0) -> torch.Tensor:
    """A logistic contrast curve on [0, 1] intensities that keeps black at -1 and white at 1."""
    lo, hi = torch.sigmoid(torch.tensor(-gain / 2)), torch.sigmoid(torch.tensor(gain / 2))
    return (torch.sigmoid(gain * ((x + 1) / 2 - 0.5)) - lo) / (hi - lo) * 2 - 1
