"""The semantic query's classifier: class-balanced training, and (slow) the demo's query on MNIST-5k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.semantic_query_bench import noiseless_histogram, query_data
from synth.kinds.datasets import fashion_available
from synth.mechanisms.privimage import PrivImageConfig
from synth.mechanisms.privimage.query import (
    balanced_class_weights,
    select_classes,
    train_classifier,
)


def test_balanced_weights_make_every_class_weigh_the_same() -> None:
    y = np.array([0] * 10 + [1] * 90 + [3] * 50)
    w = balanced_class_weights(y, 4).numpy()
    counts = np.bincount(y, minlength=4)
    assert w[2] == 0.0  # an absent class gets no weight instead of a division by zero
    totals = (w * counts)[counts > 0]
    assert np.allclose(totals, totals[0])  # each present class contributes the same total weight
    assert (w * counts).sum() == pytest.approx(len(y))  # the mean weight per image stays 1


def test_balanced_weights_are_ones_for_a_balanced_set() -> None:
    assert torch.allclose(balanced_class_weights(np.repeat(np.arange(5), 7), 5), torch.ones(5))


@pytest.mark.slow
@pytest.mark.skipif(
    not fashion_available(), reason="needs dataset-fashion-mnist (the 20-class public pool)"
)
def test_demo_query_classifier_sends_every_digit_to_its_own_public_digit() -> None:
    """Before class balancing, the demo's classifier sent most MNIST 9s to 7 or 4 and
    digit 9's noiseless count for public '9' was 41-66 of ~400, so the noisy query chose clothing for it in
    both measured demo runs. Now each digit's own class must win its row by a margin that noise rarely beats."""
    torch.set_num_threads(2)
    px, py, sx, sy, n_public = query_data()
    cfg = PrivImageConfig.demo(8.0, 1e-5, k=1)
    net = train_classifier(
        px,
        py,
        n_public,
        epochs=cfg.classifier_epochs,
        batch=cfg.classifier_batch,
        seed=0,
        device=torch.device("cpu"),
        augmented=True,
    )
    _, hist = noiseless_histogram(net, sx, sy, n_public)
    assert select_classes(hist, 1) == [[d] for d in range(10)]
    clothing_best = hist[:, 10:].max(axis=1)
    margin = np.diag(hist[:, :10]) - clothing_best
    assert margin.min() > 3 * cfg.query_sigma, (
        f"own-digit count minus best clothing count per digit: {margin}"
    )
