"""DP labels for a merf release (`teacher_labels = true`): a small classifier trained with DP-SGD on
the sensitive images labels the images the generator draws.

The generator's images are post-processing of the query; the classifier is DP-SGD (opacus: Poisson
sampling, per-example clipping to norm 1, Gaussian noise from the secure sampler), charged as its
own event beside the query. Its predictions on the drawn images are post-processing of it. Why: on
Fashion-MNIST the generator's images are drawn well enough to train on, but a class's average look
(shirt, pullover, coat) does not say where the real classes' borders run; a classifier trained on
the real images does (BENCHMARKS-NOTEBOOK.md, "DP labels")."""

from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from accounting.errors import PrivReleaseError
from accounting.events import DpSgd
from synth.tools.dp_noise import install as install_secure_noise
from synth.tools.kernel.fit import to_unit

MAX_GRAD_NORM = 1.0  # per-example clipping norm (the noise multiplier is relative to it)
LR = 1.0  # SGD with momentum 0.9: large steps suit clipped, noisy gradients (Tramer & Boneh 2021)
MOMENTUM = 0.9
LABEL_BATCH = 2000
MIN_SIZE = 28  # smaller images are read upscaled: the classifier's strides need 28 pixels
# A class whose drawings the classifier puts in that class at under this share of the median class's
# rate has collapsed (the generator draws something else). Measured on Fashion-MNIST: a healthy
# release's lowest class (shirts, with a weak epsilon-1 classifier) 0.36 of the median; a collapsed
# class (noise drawn as trousers, at epsilon 10, missed by the distance check) at most 0.13.
MIN_AGREEMENT_RATIO = 0.25
# and, whatever the median (a generator that drew noise for every class), under half of chance
MIN_AGREEMENT_OF_CHANCE = 0.5


def schedule(n_records: int, batch: int, epochs: int) -> tuple[float, int]:
    """(sample rate, steps) of the classifier's DP-SGD: opacus samples each record with rate
    1 / ceil(N / batch) (its DPDataLoader's rule), for `epochs` passes' worth of steps."""
    per_epoch = max(1, math.ceil(n_records / max(batch, 1)))
    return 1.0 / per_epoch, epochs * per_epoch


def _loader_batch(n_records: int, sample_rate: float) -> int:
    """A DataLoader batch size from which opacus derives exactly `sample_rate` (schedule's rule)."""
    per_epoch = round(1.0 / sample_rate)
    start = max(1, math.floor(n_records * sample_rate))
    for batch in range(start, n_records + 1):
        if math.ceil(n_records / batch) == per_epoch:
            return batch
    raise PrivReleaseError(
        f"Internal error: no batch size gives sample rate {sample_rate:g} over {n_records} records."
    )


def classifier(channels: int, n_classes: int) -> nn.Module:
    """Tramer & Boneh's (2021) small tanh CNN for DP-SGD, pooled to 4x4 so any size fits."""
    return nn.Sequential(
        nn.Conv2d(channels, 16, 8, 2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, 2),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 16, 32),
        nn.Tanh(),
        nn.Linear(32, n_classes),
    )


def train(
    images: np.ndarray,
    rows: np.ndarray,
    n_classes: int,
    size: int,
    dpsgd: DpSgd,
    *,
    seed: int,
    before_step: Callable[[], object] = lambda: None,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> nn.Module:
    """The classifier after the DP-SGD `dpsgd` (its steps, sample rate and noise multiplier: the
    event charged for it) on `images` (uint8 (N, H, W[, C]), sensitive) with labels `rows` (class
    positions). The sampling and the noise come from OS entropy, never from
    `seed` (public: the initialisation only), so nobody can replay them. `before_step` runs before
    each step (the runner's durable write-ahead counter: a crash mid-training charges what ran)."""
    x = torch.from_numpy(np.ascontiguousarray(images))  # uint8, converted a batch at a time
    y = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    channels, size = 1 if x.ndim == 3 else int(x.shape[-1]), max(size, MIN_SIZE)
    torch.manual_seed(seed)
    model = classifier(channels, n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    dp_model, dp_opt, dp_loader = _private(
        model, opt, x, y, dpsgd.sample_rate, dpsgd.noise_multiplier
    )
    _dp_steps(dp_model, dp_opt, dp_loader, dpsgd.steps, size, before_step, progress)
    clean = classifier(channels, n_classes)  # the weights without opacus' hooks
    clean.load_state_dict(dp_model._module.state_dict())
    return clean.eval()


def _private(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    sample_rate: float,
    noise_multiplier: float,
) -> tuple[Any, Any, Any]:
    """Opacus' private model, optimiser and Poisson loader (sampling seeded from OS entropy, at the
    planned rate or refused), with the noise from our CSPRNG."""
    from opacus import PrivacyEngine

    batch = _loader_batch(len(x), sample_rate)
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=batch,
        generator=torch.Generator().manual_seed(secrets.randbits(63)),
    )
    with warnings.catch_warnings():  # opacus' "Secure RNG turned off": the noise is ours (below)
        warnings.simplefilter("ignore")
        dp_model, dp_opt, dp_loader = PrivacyEngine(secure_mode=False).make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=MAX_GRAD_NORM,
            poisson_sampling=True,
        )
    if abs(dp_loader.sample_rate - sample_rate) > 1e-12:
        raise PrivReleaseError(
            f"Internal error: opacus samples with q={dp_loader.sample_rate} but the plan charged "
            f"q={sample_rate} (N={len(x)}, batch={batch}); nothing was trained."
        )
    install_secure_noise(dp_opt)
    return dp_model, dp_opt, dp_loader


def _dp_steps(
    dp_model: Any,
    dp_opt: Any,
    dp_loader: Any,
    steps: int,
    size: int,
    before_step: Callable[[], object],
    progress: Callable[[int, int], None],
) -> None:
    """`steps` DP-SGD steps, each counted by `before_step` before it runs."""
    done = 0
    with warnings.catch_warnings():  # "Full backward hook is firing" when inputs need no grad
        warnings.simplefilter("ignore")
        while done < steps:
            for xb, yb in dp_loader:
                if done >= steps:
                    break
                before_step()
                done += 1
                if len(xb):  # an empty Poisson batch releases nothing: skipping it is safe
                    dp_opt.zero_grad(set_to_none=True)
                    F.cross_entropy(dp_model(to_unit(xb, size)), yb).backward()
                    dp_opt.step()
                progress(done, steps)


@torch.no_grad()
def predict(model: nn.Module, images: np.ndarray, size: int) -> np.ndarray:
    """Class positions the classifier gives uint8 images (N, H, W[, C])."""
    size = max(size, MIN_SIZE)
    out = [
        model(to_unit(np.ascontiguousarray(images[i : i + LABEL_BATCH]), size)).argmax(1)
        for i in range(0, len(images), LABEL_BATCH)
    ]
    return torch.cat(out).numpy().astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def unrecognised_classes(predicted: np.ndarray, drawn: np.ndarray, n_classes: int) -> list[int]:
    """Class positions whose drawings (`drawn`) the classifier's labels (`predicted`) keep in their
    class at under MIN_AGREEMENT_RATIO times the median class's rate, or under
    MIN_AGREEMENT_OF_CHANCE times chance (1 / n_classes)."""
    rates = np.array(
        [
            float(np.mean(predicted[drawn == c] == c)) if np.any(drawn == c) else 1.0
            for c in range(n_classes)
        ]
    )
    limit = max(MIN_AGREEMENT_RATIO * float(np.median(rates)), MIN_AGREEMENT_OF_CHANCE / n_classes)
    return [int(c) for c in np.flatnonzero(rates < limit)]
