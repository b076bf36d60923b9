"""Downstream utility ("CA"): logistic regression, MLP (scikit-learn) and a small CNN (torch)
trained on the release and tested on real held-out data, beside the same classifiers trained on real
data."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

from audit.images import flat01, sample_idx, to_pm1
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset


class SmallCNN(torch.nn.Module):
    def __init__(self, channels: int, n_classes: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(channels, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * 16, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _cnn_accuracy(
    train_x, train_y, test_x, test_y, n_classes: int, epochs: int, seed: int
) -> float:
    torch.manual_seed(seed)
    xt, yt = torch.from_numpy(to_pm1(train_x)), torch.from_numpy(train_y.astype(np.int64))
    model = SmallCNN(xt.shape[1], n_classes)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for b in torch.randperm(len(xt), generator=gen).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[b]), yt[b]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = torch.cat(
            [
                model(torch.from_numpy(to_pm1(test_x[s : s + 512]))).argmax(1)
                for s in range(0, len(test_x), 512)
            ]
        ).numpy()
    return float(np.mean(pred == test_y))


def classifier_accuracies(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    n_classes: int,
    policy: AuditPolicy,
) -> dict[str, float]:
    """Test accuracy of LR, MLP and CNN trained on (train_x, train_y); uint8 images."""
    classes = np.unique(train_y)
    if len(classes) < 2:  # nothing to learn: every classifier predicts the one class it saw
        acc = float(np.mean(test_y == classes[0]))
        return {"logreg": acc, "mlp": acc, "cnn": acc}
    ftr, fte = flat01(train_x), flat01(test_x)
    out = {}
    # one BLAS thread: these fits are small, and oversubscribed BLAS threads make them ~30x slower
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        out["logreg"] = float(
            LogisticRegression(max_iter=200, C=0.5).fit(ftr, train_y).score(fte, test_y)
        )
        mlp = MLPClassifier(
            hidden_layer_sizes=(128,), max_iter=30, random_state=policy.seed, early_stopping=False
        )
        out["mlp"] = float(mlp.fit(ftr, train_y).score(fte, test_y))
    out["cnn"] = _cnn_accuracy(
        train_x, train_y, test_x, test_y, n_classes, policy.cnn_epochs, policy.seed
    )
    return out


@dataclass(frozen=True)
class UtilityNumbers:
    """compute_utility's numbers (internal: the real reference is trained on the sensitive data)."""

    release: dict[str, float]  # accuracy of each classifier trained on the release
    real_reference: dict[str, float]  # the same classifiers trained on the sensitive data
    chance: float  # held-out majority-class rate: accuracy without looking at images
    n_train_release: int
    n_train_real: int
    n_test: int

    @property
    def best(self) -> float:
        return max(self.release.values())


def compute_utility(
    images: np.ndarray,
    labels: np.ndarray,
    sensitive: ImageDataset | None,
    heldout: ImageDataset,
    policy: AuditPolicy,
) -> UtilityNumbers:
    """Train LR / MLP / CNN on the release (and, with `sensitive`, on real data), test on
    held-out."""
    rng = np.random.default_rng(policy.seed)
    tops = [labels.max(), heldout.labels.max()] + (
        [sensitive.labels.max()] if sensitive is not None else []
    )
    n_classes = int(max(tops)) + 1
    idx = sample_idx(len(images), policy.utility_train_samples, rng)
    synth = classifier_accuracies(
        images[idx], labels[idx], heldout.images, heldout.labels, n_classes, policy
    )
    real, n_real = {}, 0
    if sensitive is not None:
        ridx = sample_idx(len(sensitive), policy.utility_train_samples, rng)
        real = classifier_accuracies(
            sensitive.images[ridx],
            sensitive.labels[ridx],
            heldout.images,
            heldout.labels,
            n_classes,
            policy,
        )
        n_real = len(ridx)
    chance = float(np.bincount(heldout.labels).max() / len(heldout))
    return UtilityNumbers(synth, real, chance, len(idx), n_real, len(heldout))


def check_utility(u: UtilityNumbers, policy: AuditPolicy) -> CheckResult:
    """The utility gate: best accuracy against policy.utility_threshold(chance)."""
    threshold = policy.utility_threshold(u.chance)
    passed = None if threshold is None else u.best >= threshold
    limit = (
        "informational, no threshold"
        if threshold is None
        else (
            f"gate {threshold:.3f} = chance {u.chance:.3f} + "
            f"{policy.min_utility_gain or 0:.2f} x (1 - chance)"
        )
        + (
            f", floor {policy.min_downstream_accuracy}"
            if policy.min_downstream_accuracy is not None
            else ""
        )
    )
    parts = ", ".join(
        f"{k} {u.release[k]:.3f}"
        + (f" (real {u.real_reference[k]:.3f})" if k in u.real_reference else "")
        for k in u.release
    )
    verdict = (
        ""
        if passed is None
        else ("" if passed else " — NOT PUBLISHABLE: no better than the gate allows")
    )
    return CheckResult(
        "downstream_accuracy",
        "utility",
        passed,
        f"trained on release, tested on held-out: {parts}; best {u.best:.3f} ({limit}){verdict}",
        {
            "release": u.release,
            "real_reference": u.real_reference,
            "best": u.best,
            "chance": u.chance,
            "threshold": threshold,
            "n_train_release": u.n_train_release,
            "n_train_real": u.n_train_real,
            "n_test": u.n_test,
            "note": "real_reference: same classifiers trained on the sensitive data (internal)",
        },
    )


def run_utility(
    images: np.ndarray,
    labels: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset,
    policy: AuditPolicy,
) -> CheckResult:
    return check_utility(compute_utility(images, labels, sensitive, heldout, policy), policy)
