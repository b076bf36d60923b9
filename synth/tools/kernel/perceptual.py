"""Perceptual features beside DP-MERF's pixel features (after DP-MEPF, Harder et al., TMLR 2023):
per-channel means and standard deviations of the early feature maps of an ImageNet-pretrained
EfficientNet-Lite0 (public weights, no sensitive data in them), unit norm per image. The generator
matches their noisy class means inside the same query as the pixel features (embedding.FeatureMap),
which passes on edges and textures that a pixel kernel blurs (sandals' straps, looked at).
Measured: BENCHMARKS-NOTEBOOK.md, "Perceptual features for DP-MERF"."""

from __future__ import annotations

import torch

from synth.tools import pretrained_cnn as pretrained

# 28x28 images at 32 px through the stem and blocks 0-5 (stride 16): 256 channels, 512 statistics;
# a larger input costs several times as much per generator step (BENCHMARKS-NOTEBOOK.md,
# "Measurement history from the code").
INPUT_SIZE = 32
LAST_BLOCK = 5


def perceptual_features(x01: torch.Tensor) -> torch.Tensor:
    """(N, 1|3, H, W) images in [0, 1] -> (N, 512) rows of norm 1; differentiable in the images
    (the network's own weights are frozen)."""
    net = pretrained.efficientnet_lite0("cpu")
    x = pretrained.prepare(x01 * 2 - 1, INPUT_SIZE)
    stats = []
    for fmap in pretrained.feature_maps(net, x, LAST_BLOCK):
        stats += [fmap.mean((2, 3)), fmap.flatten(2).std(2)]
    f = torch.cat(stats, 1)
    return f / f.norm(dim=1, keepdim=True).clamp_min(1e-8)
