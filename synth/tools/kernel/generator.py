"""The small conditional generator DP-MERF trains against the noisy embedding (post-processing of
the one query: it never sees a sensitive image), and drawing labelled images from it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from synth.tools.kernel.embedding import FeatureMap, NoisyEmbedding, as_feature_map


class ConditionalGenerator(nn.Module):
    """z (z_dim) and a class -> an image in [0, 1]: a linear layer to a (2w, s/4, s/4) map, two
    nearest-neighbour upsamplings with 3x3 convolutions, batch norm and ReLU, a sigmoid output."""

    def __init__(
        self, n_classes: int, image_size: int, channels: int, z_dim: int = 60, width: int = 64
    ) -> None:
        super().__init__()
        if image_size % 4:
            raise ValueError(f"image_size must be a multiple of 4, got {image_size}")
        self.z_dim, self.base, self.width = z_dim, image_size // 4, width
        self.embed = nn.Embedding(n_classes, z_dim)
        self.fc = nn.Linear(2 * z_dim, 2 * width * self.base**2)
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(width, width // 2, 3, padding=1),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(),
            nn.Conv2d(width // 2, channels, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat([z, self.embed(y)], dim=1))
        return self.body(h.view(-1, 2 * self.width, self.base, self.base))


def train_generator(
    gen: ConditionalGenerator,
    target: NoisyEmbedding,
    w: torch.Tensor | FeatureMap,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> ConditionalGenerator:
    """Adam on DP-MERF's loss ||E_data - E_gen||^2 (sum over classes and features): E_data the noisy
    per-class feature sums over the dataset size, E_gen the same over a batch whose labels are drawn
    with the noisy class shares, in the query's feature map `w` (frequencies: pixel features only).
    The learning rate decays by 10x over the run (cosine)."""
    fmap = as_feature_map(w)
    torch.manual_seed(seed)
    gen.train()
    tgt = target.target()
    shares = torch.from_numpy(target.proportions()).float()
    n_classes = tgt.shape[0]
    opt = torch.optim.Adam(gen.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=lr / 10)
    for step in range(steps):
        y = torch.multinomial(shares, batch, replacement=True)
        x = gen(torch.randn(batch, gen.z_dim), y)
        phi = fmap(x)
        emb = torch.zeros(n_classes, phi.shape[1]).index_add_(0, y, phi) / batch
        loss = torch.sum((tgt - emb) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        progress(step + 1, steps)
    return gen.eval()


@torch.no_grad()
def draw(gen: ConditionalGenerator, labels: np.ndarray, seed: int, batch: int = 1000) -> np.ndarray:
    """Images for `labels` (class positions): uint8 (N, H, W) or (N, H, W, C)."""
    gen.eval()
    torch.manual_seed(seed)
    out = []
    y_all = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    for i in range(0, len(y_all), batch):
        y = y_all[i : i + batch]
        x = gen(torch.randn(len(y), gen.z_dim), y)
        out.append((x * 255).round().clamp(0, 255).to(torch.uint8))
    images = torch.cat(out).permute(0, 2, 3, 1).numpy()
    return images[..., 0] if images.shape[-1] == 1 else images


def resize01(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, C, H, W) in [0, 1] to size x size (bilinear), for data of another size than the
    generator's multiple of 4."""
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
