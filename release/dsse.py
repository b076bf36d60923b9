"""DSSE v1 envelopes (github.com/secure-systems-lab/dsse), signed with Ed25519.

The signature covers PAE(payloadType, payload), so neither the payload nor its type can be changed
without breaking it. The keyid is the one securesystemslib computes by default for an Ed25519 key
(sha256 of the canonical JSON of {keytype, scheme, keyval}), so its `Envelope.verify` finds the key
without configuration; bundles signed before that used sha256 of the raw key, which is still
accepted. A keyid only selects the signature to check, it is never trusted by itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accounting.errors import InvalidParameterError, TamperError
from release.pubkey import (
    PublicKeyLike,
    key_id,
    load_public_key,
    raw_public_bytes,
    verify_signature,
)

PAYLOAD_TYPE = "application/vnd.in-toto+json"
_STD = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_URLSAFE = re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}(?:==)?|[A-Za-z0-9_-]{3}=?)?")
REFETCH = "Do not use this bundle; download it again from the publisher."


def sslib_keyid(public_key: PublicKeyLike) -> str:
    """securesystemslib's default keyid of an Ed25519 key (`SSlibKey.from_crypto(key).keyid`)."""
    public_hex = raw_public_bytes(load_public_key(public_key)).hex()
    canonical = json.dumps(
        {"keytype": "ed25519", "keyval": {"public": public_hex}, "scheme": "ed25519"},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def key_ids(public_key: PublicKeyLike) -> tuple[str, str]:
    """(securesystemslib keyid, sha256 of the raw key): the ids a signature by this key may
    carry."""
    return sslib_keyid(public_key), key_id(public_key)


def pae(payload_type: str, payload: bytes) -> bytes:
    """Pre-Authentication Encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body (LEN in
    bytes, decimal)."""
    if not isinstance(payload_type, str) or not isinstance(payload, (bytes, bytearray)):
        raise InvalidParameterError("PAE needs the payload type as text and the payload as bytes.")
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), bytes(payload))


def sign_envelope(
    payload: bytes, private_key: Ed25519PrivateKey, *, payload_type: str = PAYLOAD_TYPE
) -> dict:
    """A DSSE envelope over `payload`, with one Ed25519 signature."""
    if not isinstance(private_key, Ed25519PrivateKey):
        raise InvalidParameterError("DSSE envelopes are signed with an Ed25519 private key.")
    sig = private_key.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [
            {
                "keyid": sslib_keyid(private_key.public_key()),
                "sig": base64.b64encode(sig).decode("ascii"),
            }
        ],
    }


def envelope_bytes(envelope: dict) -> bytes:
    return (json.dumps(envelope, sort_keys=True, indent=2) + "\n").encode("utf-8")


def _b64(text: Any, what: str) -> bytes:
    # The DSSE spec lets verifiers accept standard or URL-safe base64.
    if isinstance(text, str) and _STD.fullmatch(text):
        return base64.b64decode(text, validate=True)
    if isinstance(text, str) and _URLSAFE.fullmatch(text):
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))  # padding is optional there
    raise TamperError(
        f"manifest.dsse.json: the {what} is not valid base64 (corrupted or edited). {REFETCH}"
    )


def verify_envelope(
    envelope: dict | str | bytes, public_key: PublicKeyLike, *, payload_type: str = PAYLOAD_TYPE
) -> bytes:
    """Check the envelope against `public_key`; returns the payload bytes or raises TamperError."""
    if isinstance(envelope, (str, bytes, bytearray)):
        try:
            envelope = json.loads(envelope)
        except (ValueError, UnicodeDecodeError):
            raise TamperError(
                f"manifest.dsse.json: not valid JSON (corrupted or edited). {REFETCH}"
            ) from None
    if (
        not isinstance(envelope, dict)
        or not {"payload", "payloadType", "signatures"} <= envelope.keys()
    ):
        raise TamperError(
            "manifest.dsse.json: not a DSSE envelope (needs payload, payloadType and signatures). "
            + REFETCH
        )
    if envelope["payloadType"] != payload_type:
        raise TamperError(
            f"manifest.dsse.json: payloadType is {envelope['payloadType']!r}, expected "
            f"{payload_type!r} (edited, or not a privrelease manifest). {REFETCH}"
        )
    payload = _b64(envelope["payload"], "payload")
    sigs = envelope["signatures"]
    if not isinstance(sigs, list) or not sigs:
        raise TamperError(f"manifest.dsse.json: carries no signature (unsigned). {REFETCH}")
    key = load_public_key(public_key)
    want, legacy = key_ids(key)
    message = pae(payload_type, payload)
    other_ids, tried = [], 0
    for s in sigs:
        if not isinstance(s, dict) or not isinstance(s.get("keyid", ""), str):
            raise TamperError(f"manifest.dsse.json: malformed signature entry. {REFETCH}")
        kid = s.get("keyid", "")
        if kid and kid not in (want, legacy):
            other_ids.append(kid)
            continue
        tried += 1
        if verify_signature(key, message, _b64(s.get("sig"), "signature")):
            return payload
    if tried:
        raise TamperError(
            "manifest.dsse.json: the signature does not verify with the "
            f"given public key (key id {want[:16]}…): the signed manifest "
            f"or the signature was altered after signing. {REFETCH}"
        )
    raise TamperError(
        "manifest.dsse.json: signed by key id "
        f"{', '.join(k[:16] + '…' for k in other_ids)}, but the given public key has id "
        f"{want[:16]}…. Check that you were given the publisher's release.pub (wrong key?); "
        "if it is the right key, the bundle was re-signed by someone else: do not use it."
    )
