"""DPImageBench's evaluation protocol (Gong et al., CCS 2025; repo 2019ChenGong/DPImageBench), the one the
FETA-Pro, DP-FETA, PrivImage, DPDM and DP-MERF anchors in BENCHMARKS.md are measured with:

- the sensitive training set is split by `torch.manual_seed(0); random_split(train, [55000, 5000])`
  (data/dataset_loader.py): 55,000 private images train the generator, 5,000 are a validation set;
- delta = 1 / (N ln N) with N the private set's size (evaluation/evaluator.py);
- 60,000 images are generated; the classifier trains on them and the checkpoint is chosen by its accuracy on
  the 5,000 validation images with Laplace noise of scale 1 / epsilon added to the correct count; the test set
  gives only the reported number.
"""

from __future__ import annotations

import math

import numpy as np

PRIVATE_SIZE = 55_000  # MNIST / Fashion-MNIST (45,000 for 50,000-image sets such as CIFAR-10)
GENERATED = 60_000
SPLIT_SEED = 0


def split_indices(n: int, private_size: int = PRIVATE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(private, validation) indices of a training set of `n` images, exactly as DPImageBench draws them:
    torch's default CPU generator seeded with 0, one randperm of n, the first `private_size` private."""
    import torch

    if not 0 < private_size < n:
        raise ValueError(f"private_size must be in (0, {n}), got {private_size}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    return perm[:private_size], perm[private_size:]


def protocol_delta(n_private: int) -> float:
    """delta = 1 / (N ln N), DPImageBench's choice for a private set of N records."""
    if n_private < 2:
        raise ValueError(f"the private set needs at least 2 records, got {n_private}")
    return 1.0 / (n_private * math.log(n_private))
