"""sha256 of files that are not sensitive data (bundle files, models and weights a plan binds to
its approval), read in blocks. Sensitive data is never hashed plainly: accounting.fingerprint keys
it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
