"""Keyed fingerprints of sensitive data (ARCHITECTURE.md rule 4).

A plain sha256 of a dataset would let anyone holding a candidate neighbour D' test whether D' was
the registered data; an HMAC under the workspace's secret key does not. Record fingerprints serve
the audit's exact-copy check without ever putting a plain hash of a sensitive image anywhere.
"""

from __future__ import annotations

import hashlib
import hmac

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
