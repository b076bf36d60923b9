"""DPImageBench's evaluation protocol (Gong et al., CCS 2025; repo 2019ChenGong/DPImageBench), the
one the
FETA-Pro, DP-FETA, PrivImage, DPDM and DP-MERF anchors in BENCHMARKS.md and its notebook are
measured with:

- the sensitive training set is split by `torch.manual_seed(0); random_split(train, [55000, 5000])`
  (data/dataset_loader.py): 55,000 private images train the generator, 5,000 are a validation set;
- delta = 1 / (N ln N) with N the private set's size (evaluation/evaluator.py);
- 60,000 images are generated; the classifier trains on them and the checkpoint is chosen by its
accuracy on
  the 5,000 validation images with Laplace noise of scale 1 / epsilon added to the correct count;
  the test set
  gives only the reported number.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import torch

PRIVATE_SIZE = 55_000  # MNIST / Fashion-MNIST (45,000 for 50,000-image sets such as CIFAR-10)
GENERATED = 60_000
SPLIT_SEED = 0


def split_indices(n: int, private_size: int = PRIVATE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(private, validation) indices of a training set of `n` images, exactly as DPImageBench draws
    them:
    torch's default CPU generator seeded with 0, one randperm of n, the first `private_size` private."""
    if not 0 < private_size < n:
        raise ValueError(f"private_size must be in (0, {n}), got {private_size}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    return perm[:private_size], perm[private_size:]


def protocol_delta(n_private: int) -> float:
    """delta = 1 / (N ln N), DPImageBench's choice for a private set of N records."""
    if n_private < 2:
        raise ValueError(f"the private set needs at least 2 records, got {n_private}")
    return 1.0 / (n_private * math.log(n_private))


# ---------------------------------------------------------------------------- the classifiers
def _wide_basic(c_in: int, c_out: int, stride: int, drop: float) -> torch.nn.Module:
    """A pre-activation wide residual block (Zagoruyko & Komodakis 2016)."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn1, self.bn2 = nn.BatchNorm2d(c_in), nn.BatchNorm2d(c_out)
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.drop = nn.Dropout(drop)
            self.short = (
                None
                if c_in == c_out and stride == 1
                else nn.Conv2d(c_in, c_out, 1, stride, 0, bias=False)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            o = torch.relu(self.bn1(x))
            y = self.conv1(o)
            y = self.conv2(self.drop(torch.relu(self.bn2(y))))
            return y + (x if self.short is None else self.short(o))

    return Block()


def wide_resnet(channels: int, n_classes: int, depth: int = 40, widen: int = 4, drop: float = 0.3):
    """WRN-depth-widen, DPImageBench's classifier for 28x28 data (depth 40, widen 4, dropout 0.3)."""
    from torch import nn

    n = (depth - 4) // 6
    widths = [16, 16 * widen, 32 * widen, 64 * widen]
    layers: list[nn.Module] = [nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False)]
    for stage, stride in zip(range(3), (1, 2, 2), strict=True):
        for i in range(n):
            c_in = widths[stage] if i == 0 else widths[stage + 1]
            layers.append(_wide_basic(c_in, widths[stage + 1], stride if i == 0 else 1, drop))
    layers += [
        nn.BatchNorm2d(widths[3]),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(widths[3], n_classes),
    ]
    return nn.Sequential(*layers)


def cpu_cnn(channels: int, n_classes: int):
    """The protocol's CPU classifier: three 3x3 convolution blocks (16, 32, 64 channels) with batch
    norm, max pooling after the first two, global average pooling, dropout 0.3. Sized so that the
    protocol's 50 epochs over 55,000 images take minutes on 2 cores, not hours (a WRN-40-4 would
    take days)."""
    from torch import nn

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(channels, 16),
        nn.MaxPool2d(2),
        *block(16, 32),
        nn.MaxPool2d(2),
        *block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(64, n_classes),
    )


CLASSIFIERS = {
    "wrn": ("WRN-40-4 (DPImageBench's)", wide_resnet),
    "cpu-cnn": ("CPU CNN (3 conv blocks 16/32/64, BN)", cpu_cnn),
}


# ---------------------------------------------------------------------------- the protocol's score
EPOCHS = 50
BATCH = 256
LR = 0.01  # Adam; StepLR(20, 0.2)
PRECISIONS = ("float32", "bfloat16")
EMA_DECAY = 0.9999  # with DPImageBench's warm-up: min(decay, (1 + n) / (10 + n)) after n updates


@dataclass(frozen=True)
class ProtocolScore:
    """One release scored on the protocol; accuracies in [0, 1] on the real test set."""

    classifier: str  # the CLASSIFIERS key
    classifier_name: str
    epochs: int
    n_train: int  # generated images the classifier trained on (55,000 of the 60,000)
    accuracy: float  # at the epoch of best noisy validation accuracy (Laplace 1 / epsilon)
    accuracy_clean_selection: float  # at the epoch of best validation accuracy (no noise)
    best_test: float  # the best test accuracy of any epoch (an oracle: never reported as a score)
    val_curve: list[float] = field(default_factory=list)
    test_curve: list[float] = field(default_factory=list)
    seconds: float = 0.0
    precision: str = "float32"  # or "bfloat16" (autocast; see score)

    def as_dict(self) -> dict:
        return asdict(self)


class _Ema:
    """DPImageBench's exponential moving average of the parameters (evaluation/ema.py's rule)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay, self.updates = decay, 0
        self.shadow = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        # one fused call per list, not one small kernel per tensor: a WRN-40-4 has ~270 parameter
        # tensors, and a kernel launch each dominated its GPU step
        params = [p.detach() for p in model.parameters()]
        torch._foreach_mul_(self.shadow, d)
        torch._foreach_add_(self.shadow, params, alpha=1 - d)

    @torch.no_grad()
    def swap(self, model: torch.nn.Module) -> None:
        """Exchange the model's parameters with the averages (call twice to restore)."""
        for s, p in zip(self.shadow, model.parameters(), strict=True):
            tmp = p.detach().clone()
            p.copy_(s)
            s.copy_(tmp)


def _pm1(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W[, C]) -> float (N, C, H, W) in [-1, 1], as the protocol feeds its classifier."""
    x = torch.from_numpy(np.asarray(images)).float().div(255)
    x = x[:, None] if x.ndim == 3 else x.permute(0, 3, 1, 2)
    return x * 2 - 1


@torch.no_grad()
def _correct(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    device: str,
    layout: torch.memory_format = torch.contiguous_format,
) -> int:
    model.eval()
    hits = 0
    for i in range(0, len(x), 1000):
        batch = x[i : i + 1000].to(device).contiguous(memory_format=layout)
        pred = model(batch).argmax(1).cpu()
        hits += int((pred == y[i : i + 1000]).sum())
    return hits


def score(
    images: np.ndarray,
    labels: np.ndarray,
    val: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    epsilon: float,
    *,
    classifier: str = "cpu-cnn",
    epochs: int = EPOCHS,
    seed: int = 0,
    device: str = "cpu",
    precision: str = "float32",
    progress=lambda epoch, total, test_acc: None,
) -> ProtocolScore:
    """DPImageBench's `cal_acc` on one release: the generated images shuffled with seed 0, the first
    55,000 trained on for `epochs` (Adam lr 0.01, StepLR(20, 0.2), batch 256, EMA 0.9999 evaluated
    each epoch), the checkpoint chosen by the real validation set's correct count plus Laplace noise
    of scale 1 / epsilon; the test set gives only the reported accuracy.

    `precision` "bfloat16" trains and evaluates under bfloat16 autocast in channels-last layout (the
    weights, the optimiser and the average stay float32): about half a WRN's time on a GPU, for a
    lease too short for the protocol's float32 (TF32 convolutions, torch's default). The row says
    which was used."""
    import time

    from torch.nn import functional as F

    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier must be one of {sorted(CLASSIFIERS)}, got {classifier!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    started = time.time()
    order = np.random.default_rng(0).permutation(len(images))
    train_idx = order[:PRIVATE_SIZE]
    x, y = _pm1(images[train_idx]), torch.from_numpy(np.asarray(labels)[train_idx]).long()
    xv, yv = _pm1(val[0]), torch.from_numpy(np.asarray(val[1])).long()
    xt, yt = _pm1(test[0]), torch.from_numpy(np.asarray(test[1])).long()
    n_classes = int(max(y.max(), yv.max(), yt.max())) + 1
    torch.manual_seed(seed)
    name, build = CLASSIFIERS[classifier]
    model = build(x.shape[1], n_classes).to(device)
    half = precision == "bfloat16"
    layout = torch.channels_last if half else torch.contiguous_format
    model = model.to(memory_format=layout)
    autocast = partial(torch.autocast, torch.device(device).type, torch.bfloat16, enabled=half)
    ema = _Ema(model, EMA_DECAY)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.2)
    if device != "cpu":  # the whole set on the device once, not one batch copy per step
        torch.backends.cudnn.benchmark = True
        x, y = x.to(device).contiguous(memory_format=layout), y.to(device)
    gen = torch.Generator().manual_seed(seed)
    laplace = np.random.default_rng(seed)
    best_noisy, best_clean = -np.inf, -1
    acc, acc_clean, val_curve, test_curve = 0.0, 0.0, [], []
    for epoch in range(epochs):
        model.train()
        for b in torch.randperm(len(x), generator=gen).split(BATCH):
            opt.zero_grad(set_to_none=True)
            b = b.to(x.device)
            with autocast():
                loss = F.cross_entropy(model(x[b]), y[b])
            loss.backward()
            opt.step()
            ema.update(model)
        sched.step()
        ema.swap(model)
        with autocast():
            v = _correct(model, xv, yv, device, layout)
            t = _correct(model, xt, yt, device, layout) / len(xt)
        ema.swap(model)
        noisy = v + laplace.laplace(0.0, 1.0 / epsilon)
        if noisy >= best_noisy:
            best_noisy, acc = noisy, t
        if v >= best_clean:
            best_clean, acc_clean = v, t
        val_curve.append(v / len(xv))
        test_curve.append(t)
        progress(epoch + 1, epochs, t)
    return ProtocolScore(
        classifier=classifier,
        classifier_name=name,
        epochs=epochs,
        n_train=len(x),
        accuracy=round(acc, 4),
        accuracy_clean_selection=round(acc_clean, 4),
        best_test=round(max(test_curve), 4),
        val_curve=[round(a, 4) for a in val_curve],
        test_curve=[round(a, 4) for a in test_curve],
        precision=precision,
        seconds=round(time.time() - started, 1),
    )


def protocol_sets(train_source: str, test_source: str) -> tuple[tuple, tuple]:
    """(validation, test) as (images, labels): the 5,000 images the split keeps out of the private
    set, and the real test set."""
    from synth.kinds.datasets import load_source

    train, test = load_source(train_source), load_source(test_source)
    _, val_idx = split_indices(len(train))
    return (train.images[val_idx], train.labels[val_idx]), (test.images, test.labels)


def balanced_subset(labels: np.ndarray, per_class: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of up to `per_class` rows of each label (for grids and partial copies)."""
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep))


def main() -> None:
    """`python -m benchmarks.dpimagebench NPZ --dataset fashion --epsilon 1 [--classifier cpu-cnn]`:
    the protocol's score of a saved release (an npz with `images` and `labels`), one JSON line to
    --out (default benchmarks/results/dpimagebench-scores.jsonl).

    `--write-sets FILE` saves the validation and test sets to FILE (an npz) and stops; `--sets FILE`
    reads them from there instead of the installed data, so a GPU lease can score a release with
    torch and numpy alone (the release and the sets fit the 64 MiB a lease carries, our packages and
    the data sets need not travel)."""
    import argparse
    import json
    from pathlib import Path

    from benchmarks.common import machine, today

    sources = {
        "fashion": ("builtin:fashion-mnist", "builtin:fashion-mnist-test"),
        "mnist": ("builtin:mnist5k", "builtin:mnist5k-heldout"),
    }
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("npz", type=Path, nargs="?")
    parser.add_argument("--dataset", choices=sorted(sources), default="fashion")
    parser.add_argument("--epsilon", type=float, help="the release's epsilon (the noisy selection)")
    parser.add_argument("--classifier", choices=sorted(CLASSIFIERS), default="cpu-cnn")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="float32 (the protocol's) or bfloat16 autocast (about half a WRN's GPU time)",
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--sets", type=Path, help="the validation and test sets (see --write-sets)")
    parser.add_argument(
        "--write-sets", type=Path, help="save --dataset's validation and test sets here and stop"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "dpimagebench-scores.jsonl",
    )
    args = parser.parse_args()
    if args.write_sets:
        val, test = protocol_sets(*sources[args.dataset])
        np.savez_compressed(
            args.write_sets,
            dataset=args.dataset,
            val_images=val[0],
            val_labels=val[1],
            test_images=test[0],
            test_labels=test[1],
        )
        return
    if args.npz is None or args.epsilon is None:
        parser.error(
            "give the release to score (an npz with images and labels) and its --epsilon, "
            "or --write-sets FILE"
        )
    with np.load(args.npz) as data:
        images, labels = data["images"], data["labels"]
    if args.sets:
        with np.load(args.sets) as sets:
            if str(sets["dataset"]) != args.dataset:
                parser.error(
                    f"--sets {args.sets} holds {sets['dataset']}'s sets, not {args.dataset}'s: "
                    "give --dataset to match, or write the sets again with --write-sets"
                )
            val = (sets["val_images"], sets["val_labels"])
            test = (sets["test_images"], sets["test_labels"])
    else:
        val, test = protocol_sets(*sources[args.dataset])
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def progress(epoch: int, total: int, acc: float) -> None:
        print(f"epoch {epoch}/{total}: test accuracy {acc:.4f}", flush=True)

    s = score(
        images,
        labels,
        val,
        test,
        args.epsilon,
        classifier=args.classifier,
        epochs=args.epochs,
        device=device,
        precision=args.precision,
        progress=progress,
    )
    row = {
        "release": args.npz.name,
        "label": args.label,
        "dataset": args.dataset,
        "epsilon": args.epsilon,
        "n_generated": len(images),
        **s.as_dict(),
        "date": today(),
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("curve")}), flush=True)


if __name__ == "__main__":
    main()
