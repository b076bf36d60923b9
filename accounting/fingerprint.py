"""Keyed fingerprints of sensitive data (ARCHITECTURE.md rule 4).

A plain sha256 of a dataset would let anyone holding a candidate neighbour D' test whether D' was
the registered data; an HMAC under the workspace's secret key does not. Record fingerprints serve
the audit's exact-copy check without ever putting a plain hash of a sensitive image anywhere.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

import numpy as np


def _canonical_images(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images, dtype=np.uint8)


def dataset_fingerprint(key: bytes, images: np.ndarray, labels: np.ndarray) -> str:
    """HMAC-SHA256 over shape, image bytes (uint8) and labels (int64) in record order."""
    images = _canonical_images(images)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(repr(images.shape).encode())
    mac.update(images.tobytes())
    mac.update(labels.tobytes())
    return mac.hexdigest()


def record_fingerprints(key: bytes, images: np.ndarray) -> list[str]:
    """One HMAC-SHA256 per image (pixel bytes only), for exact-copy detection."""
    images = _canonical_images(images)
    return [hmac.new(key, img.tobytes(), hashlib.sha256).hexdigest() for img in images]


def volumes_fingerprint(key: bytes, records: list[bytes]) -> str:
    """HMAC-SHA256 over a volume set: each record's canonical bytes (dtype, shape, voxels, affine,
    scaling; `synth.kinds.volume.Volume.stored_bytes`) in record order, with a domain tag so that a
    volume set never shares a fingerprint with an image set."""
    return volume_digests_fingerprint(key, [hashlib.sha256(r).digest() for r in records])


def volume_digests_fingerprint(key: bytes, digests: Sequence[bytes]) -> str:
    """`volumes_fingerprint` from each record's sha256 digest (32 bytes) instead of its bytes: what
    a set held by reference is checked with, each file read once and none kept."""
    mac = hmac.new(key, b"privrelease volume set v1", digestmod=hashlib.sha256)
    mac.update(repr(len(digests)).encode())
    for digest in digests:
        mac.update(digest)
    return mac.hexdigest()


def volume_record_fingerprints(key: bytes, records: Iterable[bytes]) -> list[str]:
    """One HMAC-SHA256 per volume (its canonical bytes), for exact-copy detection (`records` may
    be a generator: one volume's bytes at a time)."""
    return [hmac.new(key, r, hashlib.sha256).hexdigest() for r in records]
