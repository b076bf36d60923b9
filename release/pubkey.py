"""Ed25519 public keys: parsing, ids and signature checks.

Kept free of the store and heavy libraries: `privrelease verify` imports only this, DSSE and the
manifest code, so it starts in a fraction of a second.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from accounting.errors import PrivReleaseError

PublicKeyLike = Ed25519PublicKey | bytes | str | os.PathLike


class KeyFileError(PrivReleaseError):
    """A key file is missing, unreadable, not Ed25519, or too widely readable."""


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: PublicKeyLike) -> str:
    """sha256 (hex) of the raw 32-byte public key."""
    return hashlib.sha256(raw_public_bytes(load_public_key(public_key))).hexdigest()


def load_public_key(source: PublicKeyLike) -> Ed25519PublicKey:
    """An Ed25519 public key from a key object, a PEM file path, PEM bytes/text, raw 32 bytes or
    their base64."""
    if isinstance(source, Ed25519PublicKey):
        return source
    if isinstance(source, os.PathLike):
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise KeyFileError(
                f"Cannot read public key file {path}: {e.strerror}. Give the path of the "
                "publisher's release.pub."
            ) from None
        return _parse_public(data, str(path))
    if isinstance(source, str):
        return _parse_public(source.encode("ascii", "replace"), "public key text")
    if isinstance(source, (bytes, bytearray)):
        return _parse_public(bytes(source), "public key bytes")
    raise KeyFileError(f"Cannot use {type(source).__name__} as a public key.")


def _parse_public(data: bytes, where: str) -> Ed25519PublicKey:
    if b"-----BEGIN" in data:
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm) as e:
            raise KeyFileError(f"{where}: not a valid PEM public key ({e}).") from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(f"{where}: not an Ed25519 public key.")
        return key
    if len(data) == 32:
        return Ed25519PublicKey.from_public_bytes(data)
    try:
        raw = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == 32:
        return Ed25519PublicKey.from_public_bytes(raw)
    raise KeyFileError(
        f"{where}: expected a PEM Ed25519 public key, or its raw 32 bytes (or their base64)."
    )


def verify_signature(public_key: PublicKeyLike, data: bytes, signature: bytes) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `data` by `public_key`."""
    key = load_public_key(public_key)
    if not isinstance(signature, (bytes, bytearray)) or len(signature) != 64:
        return False
    try:
        key.verify(bytes(signature), data)
    except InvalidSignature:
        return False
    return True
