"""The face generator: a DCGAN (64 x 64 RGB, z of 100 dimensions) and its latent inversion.

The default weights ship inside the `gan-face-generate` package (MIT licence): a DCGAN trained on
DigiFace-1M, a set of *synthetic* faces rendered from consented 3-D head scans, so the generator
never saw a real person's photograph. It is small (3.6 M parameters) and blurry: not StyleGAN2 on
FFHQ. A user with their own DCGAN weights of the same architecture gives their path
(`generator_weights`); the package's `Generator` class is the architecture, imported alone (its
inference script needs torchvision and wandb, which we do not install).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from accounting.errors import DataFormatError

PACKAGED = "gan-face-generate (DCGAN on DigiFace-1M, 64x64)"
SIZE = 64


def packaged_weights() -> Path:
    spec = importlib.util.find_spec("gan_face_generate")
    if spec is None or not spec.submodule_search_locations:
        raise DataFormatError(
            "The face generator ships in the Python package gan-face-generate, which is not "
            "installed. Run `make venv`, which installs it."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "weights.tar"


@dataclass(frozen=True)
class FaceGenerator:
    """A frozen generator: `net(z (N, latent_dim, 1, 1)) -> (N, 3, 64, 64)` in [-1, 1]."""

    net: torch.nn.Module
    latent_dim: int
    name: str
    sha256: str  # of the weights file: the release records which generator ran


def load_generator(weights: str | None, latent_dim: int, features: int) -> FaceGenerator:
    """The packaged DCGAN (`weights` None) or a user's state dict of the same architecture (a
    file holding either the state dict or {"netG_state_dict": ...})."""
    from gan_face_generate.models import Generator

    path = packaged_weights() if weights is None else Path(weights)
    if not path.is_file():
        raise DataFormatError(f"{path}: no generator weights file there; give the path of a file.")
    raw = path.read_bytes()  # hashed and loaded from the same bytes: what ran is what was hashed
    digest = hashlib.sha256(raw).hexdigest()
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a file that is not a checkpoint
        raise DataFormatError(f"{path}: not a PyTorch checkpoint ({exc}).") from exc
    if isinstance(state, dict) and "netG_state_dict" in state:
        state = state["netG_state_dict"]
    net = Generator(0, 3, latent_dim, features)
    try:
        net.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise DataFormatError(
            f"{path}: these weights do not fit a DCGAN generator with latent_dim={latent_dim} and "
            f"generator_features={features} ({str(exc).splitlines()[0]})."
        ) from exc
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    name = PACKAGED if weights is None else f"DCGAN weights {path.name}"
    return FaceGenerator(net, latent_dim, name, digest)


def to_tensor(crops: np.ndarray) -> torch.Tensor:
    """uint8 (N, 64, 64, 3) -> float (N, 3, 64, 64) in [-1, 1]."""
    return torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """float (N, 3, H, W) in [-1, 1] -> uint8 (N, H, W, 3)."""
    x = ((x.detach().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def _structure(x: torch.Tensor) -> torch.Tensor:
    """A 16 x 16 view: pose, lighting and colour layout without the identity's fine detail."""
    return F.avg_pool2d(x, 4)


@dataclass(frozen=True)
class LatentBank:
    """Latents drawn from the prior and the coarse views of their faces: the inversion's starting
    points (public: computed from the generator alone)."""

    z: torch.Tensor  # (n, latent_dim, 1, 1)
    views: torch.Tensor  # (n, 3, 16, 16)


@torch.no_grad()
def latent_bank(gen: FaceGenerator, n: int, seed: int, batch: int = 64) -> LatentBank:
    z = torch.randn(n, gen.latent_dim, 1, 1, generator=torch.Generator().manual_seed(seed))
    views = torch.cat([_structure(gen.net(z[i : i + batch])) for i in range(0, n, batch)])
    return LatentBank(z, views)


def invert(
    gen: FaceGenerator,
    bank: LatentBank,
    target: np.ndarray,
    weight: np.ndarray,
    steps: int,
    restarts: int,
    lr: float,
) -> tuple[torch.Tensor, float]:
    """The latent whose image is closest to the aligned crop `target` (uint8 64 x 64 x 3): the
    `restarts` bank latents whose coarse views are closest, refined together by `steps` of Adam on
    L1 over the pixels (weighted by `weight`, 64 x 64 in [0, 1]) plus the coarse-view term and a
    Gaussian prior on z. Returns (z (1, latent_dim, 1, 1), loss)."""
    y = to_tensor(target[None])
    w = torch.from_numpy(weight).float()[None, None]
    coarse = (bank.views - _structure(y)).pow(2).mean((1, 2, 3))
    start = torch.topk(-coarse, min(restarts, len(coarse))).indices
    z = bank.z[start].clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)

    def losses() -> torch.Tensor:
        x = gen.net(z)
        pixel = (w * (x - y).abs()).mean((1, 2, 3)) / w.mean()
        return pixel + 2.0 * (_structure(x) - _structure(y)).pow(2).mean((1, 2, 3))

    for _ in range(steps):
        opt.zero_grad()
        (losses().sum() + 1e-3 * z.pow(2).mean((1, 2, 3)).sum()).backward()
        opt.step()
    with torch.no_grad():
        per = losses()
    best = int(torch.argmin(per))
    return z.detach()[best : best + 1], float(per[best])


def nearest_latents(
    bank: LatentBank, target: np.ndarray, n: int, rng: torch.Generator
) -> list[torch.Tensor]:
    """`n` bank latents whose coarse views (pose, lighting, colour layout) are among the closest to
    the aligned crop `target`: drawn at random from the closest 4n, so that two faces of one
    person do not get the same replacement."""
    coarse = (bank.views - _structure(to_tensor(target[None]))).pow(2).mean((1, 2, 3))
    pool = torch.argsort(coarse)[: max(n, min(len(coarse), 4 * n))]
    pick = pool[torch.randperm(len(pool), generator=rng)[:n]]
    chosen = [bank.z[int(i)][None] for i in pick]
    while len(chosen) < n:  # a bank smaller than n: fill from the prior
        chosen.append(torch.randn(bank.z[:1].shape, generator=rng))
    return chosen


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation between latents (stays where the Gaussian prior puts its mass)."""
    af, bf = a.flatten(), b.flatten()
    cos = torch.clamp(torch.dot(af, bf) / (af.norm() * bf.norm() + 1e-12), -1.0, 1.0)
    omega = torch.arccos(cos)
    if float(omega) < 1e-4:
        return (1 - t) * a + t * b
    return (torch.sin((1 - t) * omega) * a + torch.sin(t * omega) * b) / torch.sin(omega)


@torch.no_grad()
def render(gen: FaceGenerator, z: torch.Tensor) -> np.ndarray:
    return to_uint8(gen.net(z))
