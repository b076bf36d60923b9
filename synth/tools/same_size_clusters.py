"""Same-size clustering of codes (k-SALSA / k-Same-furthest style), shared by k-SALSA and the plan's
k-anonymity estimate (release/kanon_estimate.py).

Repeat while at least k points remain: take the remaining point with the largest average distance to
the other remaining points, and group it with its k-1 nearest remaining points. Every cluster has
exactly k members. The n mod k points left at the end (the ones nearest the bulk of the data, since
outliers are taken first) are the REMAINDER: they are not released at all (dropped), so no released
image averages fewer than k records.

No n x n matrix is stored: distance sums are kept per point and updated as clusters are removed, so
memory is O(n) and time O(n^2 d).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accounting.errors import InvalidParameterError
from synth.progress import ProgressFn, no_progress


@dataclass
class ClusterResult:
    # indices into the input, k each, disjoint; first index = the seed (outlier)
    clusters: list[np.ndarray]
    remainder: np.ndarray  # indices that are not released (n mod k of them)

    @property
    def kept(self) -> np.ndarray:
        return np.sort(np.concatenate(self.clusters)) if self.clusters else np.zeros(0, np.int64)


def _dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances (len(a), len(b))."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(d2, 0.0))


def same_size_clusters(
    latents: np.ndarray, k: int, progress: ProgressFn = no_progress, chunk: int = 2048
) -> ClusterResult:
    """Partition the rows of `latents` (n, d) into n // k clusters of exactly k, plus a
    remainder."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise InvalidParameterError(f"k must be an integer >= 2, got {k!r}.")
    z = np.asarray(latents, dtype=np.float64)
    if z.ndim != 2 or z.shape[0] == 0:
        raise InvalidParameterError(
            f"latents must be a non-empty (n, d) array, got shape {z.shape}."
        )
    if not np.isfinite(z).all():
        raise InvalidParameterError("latents contain NaN or infinite values; check the encoder.")
    n = len(z)
    if k > n:
        raise InvalidParameterError(
            f"k={k} is larger than the number of records ({n}); choose k <= {n}."
        )

    # sums[i] = sum of distances from i to every remaining point (computed in chunks: no n x n
    # matrix)
    sums = np.concatenate([_dist(z[i : i + chunk], z).sum(1) for i in range(0, n, chunk)])
    remaining = np.ones(n, dtype=bool)
    clusters: list[np.ndarray] = []
    total = n // k
    for c in range(total):
        live = np.flatnonzero(remaining)
        # largest average distance (same count for all, so the sum)
        seed = live[np.argmax(sums[live])]
        d = _dist(z[seed : seed + 1], z[live])[0]
        d[live == seed] = -1.0  # the seed itself comes first
        members = live[np.argsort(d, kind="stable")[:k]]
        clusters.append(members)
        remaining[members] = False
        sums -= _dist(z, z[members]).sum(1)
        progress("clustering", c + 1, total)
    return ClusterResult(clusters, np.flatnonzero(remaining))
