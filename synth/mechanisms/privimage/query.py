"""Semantic query: a classifier trained on PUBLIC data, the DP semantic distribution of the
sensitive data, and the selection of public classes from it (PrivImage, USENIX Security 2024)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from accounting.errors import InvalidParameterError
from synth.mechanisms.privimage.augment import augment_public
from synth.progress import ProgressFn, no_progress


def make_classifier(channels: int, n_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.LazyLinear(128),
        nn.ReLU(),
        nn.Linear(128, n_classes),
    )


def balanced_class_weights(y: np.ndarray, n_classes: int) -> torch.Tensor:
    """Cross-entropy weights n / (C * count) per class, C the classes present (0 for an absent
    class): every public class weighs the same in the loss and an image weighs 1 on average. The
    built-in pool holds 1,000 images per clothing class but ~180 per digit, and an unweighted
    classifier leans ambiguous sensitive digits towards clothing (BENCHMARKS.md, "Semantic
    query")."""
    counts = np.bincount(np.asarray(y, dtype=np.int64), minlength=n_classes).astype(np.float64)
    weights = np.divide(
        len(y), np.count_nonzero(counts) * counts, out=np.zeros(n_classes), where=counts > 0
    )
    return torch.tensor(weights, dtype=torch.float32)


def train_classifier(
    x: torch.Tensor,
    y: np.ndarray,
    n_classes: int,
    *,
    epochs: int,
    batch: int,
    seed: int,
    device: torch.device,
    progress: ProgressFn = no_progress,
    stage: str = "query classifier",
    augmented: bool = False,
    elastic: bool = False,
    balanced: bool = True,
) -> nn.Module:
    """Cross-entropy training of the semantic query function on the public labelled set,
    class-balanced unless `balanced` is False. `augmented` distorts every batch (affine, stroke
    thickness and, with `elastic`, elastic distortion and sharpening) so the function transfers to
    other digit styles than the public set's. The switches exist for the ablation (BENCHMARKS.md,
    "Semantic query": elastic distortion and twice the epochs bought no safer selection); the
    pipeline uses the defaults."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = make_classifier(x.shape[1], n_classes)
    net(x[:2])  # materialise the lazy layer
    net = net.to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    weight = balanced_class_weights(y, n_classes).to(device) if balanced else None
    per_epoch = -(-len(x) // batch)
    total, done = epochs * per_epoch, 0
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            xb = x[idx].to(device)
            if augmented:
                xb = augment_public(xb, gen, elastic=elastic, sharpen=elastic)
            loss = nn.functional.cross_entropy(net(xb), yt[idx].to(device), weight=weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            progress(stage, done, total)
    return net.eval()


@torch.no_grad()
def top_k_predictions(
    net: nn.Module, x: torch.Tensor, k: int, device: torch.device, batch: int = 512
) -> np.ndarray:
    """(N, k) indices of each image's k most probable public classes."""
    out = [
        net(x[i : i + batch].to(device)).topk(k, dim=1).indices.cpu()
        for i in range(0, len(x), batch)
    ]
    return torch.cat(out).numpy()


def semantic_histogram(
    top_k: np.ndarray, row_of: np.ndarray, n_rows: int, n_public: int
) -> np.ndarray:
    """Row r, column j: how many images of row r have public class j among their top-k predictions.
    Each image adds 1 to k distinct cells of one row, so the L2 sensitivity is sqrt(k).
    Only ever used inside `noisy_semantic_histogram`; never stored."""
    hist = np.zeros((n_rows, n_public), dtype=np.float64)
    np.add.at(hist, (np.repeat(row_of, top_k.shape[1]), top_k.reshape(-1)), 1.0)
    return hist


def noisy_semantic_histogram(
    top_k: np.ndarray,
    row_of: np.ndarray,
    n_rows: int,
    n_public: int,
    noise_std: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """The DP semantic distribution: the histogram plus N(0, noise_std^2) in every cell."""
    if len(np.unique(top_k[0])) != top_k.shape[1]:
        raise InvalidParameterError(
            "Top-k predictions must be distinct classes (sensitivity relies on it)."
        )
    hist = semantic_histogram(top_k, row_of, n_rows, n_public)
    return hist + rng.normal(0.0, noise_std, size=hist.shape)


@dataclass(frozen=True)
class Selection:
    chosen: list[list[int]]  # per sensitive class (row): the public classes it selected
    public_index: np.ndarray  # indices into the public set of the selected images
    new_labels: np.ndarray  # row (sensitive class position) that chose each selected image
    ratio: float  # selected images / public images


# a cell must also clear 4 noise stds: a pure-noise cell does so with probability 3e-5
FIT_NOISE_STDS = 4.0


def select_classes(noisy: np.ndarray, k: int) -> list[list[int]]:
    """Top-k public classes per row, disjoint across rows. Rounds: in each round every row that
    still wants a class takes its best remaining one, rows served in order of that class's noisy
    count (so a class wanted by two rows goes to the row where it is most frequent). When the pool
    has fewer than rows*k classes, later rounds run out and some rows keep fewer than k."""
    n_rows, n_public = noisy.shape
    if n_public < n_rows:
        raise InvalidParameterError(
            f"The public set has {n_public} classes but the sensitive set has {n_rows}: every "
            "sensitive class needs at least one public class of its own. Use a public set with "
            "more classes, or share_public_classes."
        )
    chosen: list[list[int]] = [[] for _ in range(n_rows)]
    taken: set[int] = set()
    for _ in range(min(k, n_public)):
        pairs = sorted(
            ((noisy[r, j], r, j) for r in range(n_rows) for j in range(n_public) if j not in taken),
            key=lambda p: (-p[0], p[1], p[2]),
        )
        served: set[int] = set()
        for _, r, j in pairs:
            if r in served or j in taken:
                continue
            chosen[r].append(j)
            taken.add(j)
            served.add(r)
    return chosen


def fit_floor(noisy: np.ndarray, k: int, fit_threshold: float, noise_std: float) -> np.ndarray:
    """Per row, the noisy count a public class needs to fit it: `fit_threshold` x the row's noisy
    size (its noisy sum / k, post-processing of the DP histogram), and at least FIT_NOISE_STDS noise
    stds."""
    size = np.maximum(np.asarray(noisy).sum(axis=1) / k, 0.0)
    return np.maximum(fit_threshold * size, FIT_NOISE_STDS * noise_std)


def select_fitting(
    noisy: np.ndarray, k: int, *, fit_threshold: float, noise_std: float, shared: bool
) -> list[list[int]]:
    """Like select_classes, but a public class is chosen for a row only where its noisy count clears
    the row's fit_floor, so a row can end with no class (it then falls back to the domain-agnostic
    prior); with `shared` every row takes its own top-k fitting classes, a public class serving
    several rows."""
    noisy = np.asarray(noisy, dtype=np.float64)
    floor = (
        fit_floor(noisy, k, fit_threshold, noise_std)
        if fit_threshold > 0
        else np.full(len(noisy), -np.inf)
    )
    if shared:
        return [
            [int(j) for j in np.argsort(-row, kind="stable")[:k] if row[j] >= f]
            for row, f in zip(noisy, floor, strict=True)
        ]
    fits = np.where(noisy >= floor[:, None], noisy, -np.inf)
    chosen = select_classes(fits, k)
    return [[j for j in cols if np.isfinite(fits[r, j])] for r, cols in enumerate(chosen)]


def build_selection(chosen: list[list[int]], public_labels: np.ndarray) -> Selection:
    """The public images of every chosen class, labelled with the row that chose it; an image of a
    class shared by several rows appears once per row. Empty when no row chose anything (all fell
    back)."""
    labels = np.asarray(public_labels)
    pairs = sorted(
        (int(i), r)
        for r, cols in enumerate(chosen)
        for j in cols
        for i in np.flatnonzero(labels == j)
    )
    if any(chosen) and not pairs:
        raise InvalidParameterError(
            "The selected public classes contain no images; check the public set's labels."
        )
    idx = np.array([i for i, _ in pairs], dtype=np.int64)
    new_labels = np.array([r for _, r in pairs], dtype=np.int64)
    return Selection(chosen, idx, new_labels, float(len(np.unique(idx)) / len(labels)))
