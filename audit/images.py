"""Image conversions and the audit-scoped cache of EfficientNet-Lite0 embeddings shared by the
checks.

The cache lives in memory only (never on disk) and only inside `audit_cache()` (one audit, or one
benchmark run): embeddings and FID statistics of sensitive images are sensitive, so nothing outlives
the audit that computed them (e.g. in a long-running dashboard server)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

_SCOPE: ContextVar[dict[str, Any] | None] = ContextVar("privrelease_audit_cache", default=None)


@contextmanager
def audit_cache() -> Iterator[dict[str, Any]]:
    """Cache embeddings and FID statistics for the duration of the block, then drop them."""
    cache: dict[str, Any] = {}
    token = _SCOPE.set(cache)
    try:
        yield cache
    finally:
        _SCOPE.reset(token)
        cache.clear()


def scoped_cache() -> dict[str, Any] | None:
    """The current audit's cache, or None outside `audit_cache()` (then nothing is cached)."""
    return _SCOPE.get()


def content_key(kind: str, images: np.ndarray) -> str:
    return (
        kind
        + hashlib.sha256(
            repr(images.shape).encode() + np.ascontiguousarray(images).tobytes()
        ).hexdigest()
    )


def to_pm1(images: np.ndarray) -> np.ndarray:
    """uint8 (N,H,W) or (N,H,W,C) -> float32 (N,C,H,W) in [-1, 1]."""
    x = np.asarray(images, dtype=np.float32) / 127.5 - 1.0
    return x[:, None] if x.ndim == 3 else np.moveaxis(x, -1, 1)


def flat01(images: np.ndarray) -> np.ndarray:
    """Flattened pixels in [0, 1], float32, one row per image."""
    return (np.asarray(images, dtype=np.float32) / 255.0).reshape(len(images), -1)


def nearest(query: np.ndarray, ref: np.ndarray, chunk: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Euclidean distance from each query row to its nearest ref row, and that row's index."""
    ref = np.asarray(ref, dtype=np.float32)
    ref_sq = (ref * ref).sum(1)
    dists, idx = np.empty(len(query), np.float32), np.empty(len(query), np.int64)
    for s in range(0, len(query), chunk):
        q = np.asarray(query[s : s + chunk], dtype=np.float32)
        d2 = (q * q).sum(1)[:, None] + ref_sq[None, :] - 2.0 * q @ ref.T
        j = d2.argmin(1)
        idx[s : s + chunk] = j
        dists[s : s + chunk] = np.sqrt(np.maximum(d2[np.arange(len(q)), j], 0.0))
    return dists, idx


def rms_nearest(query_images: np.ndarray, ref_images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RMS pixel distance (pixels in [0, 1]) to the nearest reference image, and its index."""
    q, r = flat01(query_images), flat01(ref_images)
    d, j = nearest(q, r)
    return d / np.sqrt(q.shape[1]), j


def embed_images(images: np.ndarray) -> np.ndarray:
    """EfficientNet-Lite0 pooled features (1280-d) of uint8 images, cached by content within an
    audit."""
    import torch

    from synth.tools.pretrained_cnn import embed

    cache = scoped_cache()
    key = content_key("embed:", images)
    if cache is not None and key in cache:
        return cache[key]
    feats = embed(torch.from_numpy(to_pm1(images))).numpy()
    if cache is not None:
        cache[key] = feats
    return feats


def l2_normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def sample_idx(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted random subset of range(n) of size min(n, m)."""
    return np.arange(n) if n <= m else np.sort(rng.choice(n, m, replace=False))
