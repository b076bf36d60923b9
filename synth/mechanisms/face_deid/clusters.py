"""Clusters of k distinct people for the k-Same-M average (synth.mechanisms.face_deid.average).

Two faces are one person when any searched recogniser verifies them (its distance below its
same-person threshold): merging too much only makes the count of people smaller, which is the safe
side. Clusters are formed k-SALSA's way (same-size, greedy), inside a head-pose neighbourhood: the
face turned farthest from frontal picks the k - 1 nearest in pose among faces of other people;
faces left over (fewer than k people remain) join the nearest cluster that does not hold their
person. A face with no such cluster, or turned farther than `max_yaw`, gets none (the fallback).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FaceKey:
    """Where a face is: its photo's index and its place among that photo's faces."""

    photo: int
    face: int


def people(
    embeddings: Sequence[Sequence[np.ndarray | None]],
    thresholds: Sequence[float],
    distance: Sequence[object],
) -> list[int]:
    """Each face's person (0, 1, ...): the connected groups of faces some recogniser verifies.
    `embeddings[f][r]`: face f by recogniser r (None: not seen); `distance[r](a, b)` -> array."""
    n = len(embeddings)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for r, limit in enumerate(thresholds):
        seen = [f for f in range(n) if embeddings[f][r] is not None]
        for a_i, a in enumerate(seen):
            for b in seen[a_i + 1 :]:
                d = float(np.asarray(distance[r](embeddings[a][r], embeddings[b][r])).ravel()[0])  # type: ignore[operator]
                if d < limit:
                    parent[root(a)] = root(b)
    roots: dict[int, int] = {}
    return [roots.setdefault(root(i), len(roots)) for i in range(n)]


def clusters(
    poses: np.ndarray, persons: Sequence[int], k: int, max_yaw: float, max_spread: float
) -> list[list[int]]:
    """Clusters (lists of face indices) of at least k distinct people each; `poses` (n, 2): yaw
    and pitch in degrees. Faces in no cluster are those without k pose-matched people."""
    poses = np.asarray(poses, dtype=np.float64).reshape(-1, 2)
    eligible = [i for i in range(len(poses)) if abs(poses[i, 0]) <= max_yaw]
    free = sorted(eligible, key=lambda i: (-abs(poses[i, 0]), i))
    out: list[list[int]] = []
    waiting: list[int] = []

    def dist(a: int, b: int) -> float:
        return float(np.hypot(*(poses[a] - poses[b])))

    while len({persons[i] for i in free}) >= k:
        seed = free[0]
        members, taken = [seed], {persons[seed]}
        for f in sorted(free[1:], key=lambda f: (dist(seed, f), f)):
            if persons[f] not in taken and dist(seed, f) <= max_spread:
                members.append(f)
                taken.add(persons[f])
                if len(members) == k:
                    break
        free.remove(seed)
        if len(members) == k:
            out.append(members)
            free = [f for f in free if f not in members]
        else:  # no k people near this pose: it waits for a leftover place
            waiting.append(seed)
    for f in waiting + free:
        _leftover(f, out, poses, persons, max_spread)
    return out


def _leftover(
    f: int, out: list[list[int]], poses: np.ndarray, persons: Sequence[int], max_spread: float
) -> None:
    """Face f joins the cluster nearest in pose (its mean) that does not hold its person and
    lies within `max_spread`; none: it stays out."""
    best, best_d = None, np.inf
    for c in out:
        if persons[f] in {persons[m] for m in c}:
            continue
        d = float(np.hypot(*(poses[f] - poses[c].mean(0))))
        if d <= max_spread and d < best_d:
            best, best_d = c, d
    if best is not None:
        best.append(f)
