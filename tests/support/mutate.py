"""Seeded mutations of well-formed image files (issue 66): bit flips, overwritten bytes,
truncations, chunk splices and deletions, as a damaged disk, an interrupted copy or a hostile
sender would make them. The same seed always gives the same files."""

from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image

INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF)


def photo_seeds() -> dict[str, bytes]:
    """One small well-formed photograph per format the photo kind reads."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    pixels[8:40, 16:48] = (200, 120, 60)  # a flat patch: compressors build runs and tables
    rgb = Image.fromarray(pixels)
    out: dict[str, bytes] = {}
    for fmt, suffix, options in (
        ("PNG", ".png", {}),
        ("JPEG", ".jpg", {"quality": 80, "exif": _exif()}),
        ("GIF", ".gif", {}),
        ("TIFF", ".tif", {"compression": "tiff_deflate"}),
        ("WEBP", ".webp", {"quality": 70}),
    ):
        buf = io.BytesIO()
        im = rgb.convert("P", palette=Image.Palette.ADAPTIVE) if fmt == "GIF" else rgb
        im.save(buf, fmt, **options)
        out[suffix] = buf.getvalue()
    # several frames: the frame count is read from the whole file (a truncated animated GIF
    # failed there with IndexError); refused as one file of many images when whole
    frames = [Image.fromarray(np.roll(pixels, 9 * k, axis=1)).convert("P") for k in range(3)]
    for name, fmt in (("anim.gif", "GIF"), ("pages.tif", "TIFF")):
        buf = io.BytesIO()
        frames[0].save(buf, fmt, save_all=True, append_images=frames[1:])
        out[name] = buf.getvalue()
    return out


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 1
    exif[0x010F] = "Camera"
    return exif.tobytes()


def mutate(data: bytes, rng: random.Random, donors: list[bytes] | None = None) -> bytes:
    """One to three mutations of `data`; headers (the first 256 bytes) are hit more often."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not out:
            break
        kind = rng.random()
        head = min(len(out), 256)
        pos = rng.randrange(head) if rng.random() < 0.5 else rng.randrange(len(out))
        if kind < 0.35:  # bit flips
            for _ in range(rng.randint(1, 8)):
                p = rng.randrange(len(out)) if rng.random() < 0.5 else pos
                out[p] ^= 1 << rng.randrange(8)
        elif kind < 0.5:  # an interesting value (lengths, counts, flags)
            out[pos] = rng.choice(INTERESTING)
        elif kind < 0.7:  # truncated: an interrupted copy
            out = out[: rng.randrange(len(out))]
        elif kind < 0.85:  # a chunk spliced in from elsewhere (this file or another)
            src = rng.choice(donors) if donors else bytes(out)
            a = rng.randrange(len(src))
            chunk = src[a : a + rng.randint(1, 64)]
            if rng.random() < 0.5:
                out[pos : pos + len(chunk)] = chunk
            else:
                out[pos:pos] = chunk
        else:  # a chunk deleted
            del out[pos : pos + rng.randint(1, 64)]
    return bytes(out)
