"""Procedurally generated public images: a domain-agnostic pre-training source that needs no
matching public set.

Three kinds, in equal shares (Baradad et al., "Learning to see by looking at noise", NeurIPS 2021;
DP-SynGen, arXiv 2412.09842): dead leaves (overlapping discs and boxes of random grey levels),
random shapes (filled or outlined polygons and ellipses, light on a black background like
MNIST-style scans) and rendered glyphs (letters of the DejaVu fonts that matplotlib ships: offline,
no system fonts needed). Digits are left out of the glyphs so that they never look like a public
digit class. Deterministic for a seed; no data is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from accounting.errors import InvalidParameterError
from synth.kinds.datasets import ImageDataset

KINDS = ("dead leaves", "shapes", "glyphs")
GLYPHS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz&%@#?!"
SUPERSAMPLE = 4  # draw at 4x and downsample: anti-aliased edges like a scan's


def _fonts() -> list[Path]:
    import matplotlib

    root = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    fonts = sorted(root.glob("DejaVu*.ttf"))
    if not fonts:
        raise InvalidParameterError(
            f"No DejaVu fonts under {root}: reinstall matplotlib (it ships them)."
        )
    return fonts


def _dead_leaves(draw: ImageDraw.ImageDraw, rng: np.random.Generator, s: int) -> None:
    for _ in range(int(rng.integers(5, 25))):
        r = s * float(rng.uniform(0.05, 0.35))
        cx, cy = rng.uniform(-0.1, 1.1, 2) * s
        box = [cx - r, cy - r * rng.uniform(0.5, 1.5), cx + r, cy + r * rng.uniform(0.5, 1.5)]
        grey = int(rng.integers(0, 256))
        (draw.ellipse if rng.random() < 0.6 else draw.rectangle)(box, fill=grey)


def _shapes(draw: ImageDraw.ImageDraw, rng: np.random.Generator, s: int) -> None:
    for _ in range(int(rng.integers(1, 4))):
        grey = int(rng.integers(120, 256))
        width = int(s * rng.uniform(0.03, 0.1))
        cx, cy = rng.uniform(0.25, 0.75, 2) * s
        r = s * float(rng.uniform(0.12, 0.4))
        fill = grey if rng.random() < 0.5 else None
        if rng.random() < 0.35:
            draw.ellipse(
                [cx - r, cy - r * rng.uniform(0.4, 1.0), cx + r, cy + r * rng.uniform(0.4, 1.0)],
                fill=fill,
                outline=grey,
                width=width,
            )
        else:
            n = int(rng.integers(3, 8))
            angles = np.sort(rng.uniform(0, 2 * np.pi, n))
            radii = r * rng.uniform(0.5, 1.0, n)
            pts = [
                (cx + a * np.cos(t), cy + a * np.sin(t)) for a, t in zip(radii, angles, strict=True)
            ]
            draw.polygon(pts, fill=fill, outline=grey, width=width)


def _glyph(img: Image.Image, rng: np.random.Generator, s: int, fonts: list[Path]) -> Image.Image:
    font = ImageFont.truetype(
        str(fonts[int(rng.integers(len(fonts)))]), int(s * rng.uniform(0.55, 0.9))
    )
    ch = GLYPHS[int(rng.integers(len(GLYPHS)))]
    draw = ImageDraw.Draw(img)
    left, top, right, bottom = draw.textbbox((0, 0), ch, font=font)
    x = (s - (right - left)) / 2 - left + rng.uniform(-0.1, 0.1) * s
    y = (s - (bottom - top)) / 2 - top + rng.uniform(-0.1, 0.1) * s
    draw.text((x, y), ch, fill=int(rng.integers(150, 256)), font=font)
    return img.rotate(float(rng.uniform(-20, 20)), resample=Image.Resampling.BILINEAR)


def procedural_images(n: int, size: int, seed: int, channels: int = 1) -> ImageDataset:
    """`n` images of `size` x `size` (grey, or grey repeated over 3 channels), labelled by kind
    (KINDS)."""
    if not isinstance(n, int) or n < 1 or size < 8:
        raise InvalidParameterError(
            f"procedural images need n >= 1 and size >= 8, got n={n!r}, size={size!r}."
        )
    rng = np.random.default_rng(seed)
    fonts, s = _fonts(), size * SUPERSAMPLE
    kinds = np.arange(n) % len(KINDS)
    out = np.empty((n, size, size), dtype=np.uint8)
    for i, kind in enumerate(kinds):
        img = Image.new("L", (s, s), 0)
        if kind == 0:
            _dead_leaves(ImageDraw.Draw(img), rng, s)
        elif kind == 1:
            _shapes(ImageDraw.Draw(img), rng, s)
        else:
            img = _glyph(img, rng, s, fonts)
        out[i] = np.asarray(img.resize((size, size), Image.Resampling.BOX))
    images = out if channels == 1 else np.repeat(out[..., None], 3, -1)
    return ImageDataset(
        images, kinds.astype(np.int64), list(KINDS), f"procedural(seed={seed})", [0, 1, 2]
    )
