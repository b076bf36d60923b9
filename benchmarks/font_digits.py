"""`make demo` with font-rendered digits added to the public pool's digit classes: does public
pre-training on sharper digits than the 8x8 UCI scans give a better release?

    python -m benchmarks.font_digits WORK_DIR [--per-class 600] [--seed 0]

Renders PER_CLASS images of each digit 0-9 from the DejaVu fonts matplotlib ships (the `Display`
cuts, which hold no digits, left out), with random stroke width, shear and rotation, cropped to a
20-pixel box and centred by mass in 28x28 as MNIST was made; writes them with the built-in public
pool (UCI digits under the same labels, Fashion-MNIST) to WORK_DIR/pool.npz and a grid to
WORK_DIR/rendered-grid.png; then runs the demo with that pool as its public data in
WORK_DIR/workspace (pre-training is not the shipped checkpoint's: it runs here, cached in
WORK_DIR/cache). Score the release with `python -m benchmarks.release_seeds
WORK_DIR/workspace/artifacts/*/release.npz`.
The public images are rendered, not read: no sensitive record is involved.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage

from release.bundle import sample_grid
from synth.kinds.datasets import public_pool
from synth.mechanisms.privimage.procedural import _fonts

CANVAS = 224  # drawing size before the crop
BOX = 20  # MNIST's digit box inside its 28x28 frame


def render_digit(digit: int, font: Path, rng: np.random.Generator) -> np.ndarray:
    """One 28x28 uint8 digit, light on black, centred by mass."""
    img = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(img).text(
        (CANVAS // 4, CANVAS // 8),
        str(digit),
        fill=255,
        font=ImageFont.truetype(str(font), 80),
        stroke_width=int(rng.integers(0, 7)),
        stroke_fill=255,
    )
    shear = float(rng.uniform(-0.35, 0.35))
    img = img.transform(
        img.size,
        Image.Transform.AFFINE,
        (1, shear, -shear * CANVAS / 2, 0, 1, 0),
        resample=Image.Resampling.BILINEAR,
    ).rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR)
    a = np.asarray(img)
    ys, xs = np.nonzero(a > 30)
    a = a[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    scale = BOX / max(a.shape) * float(rng.uniform(0.85, 1.0))
    h, w = max(1, round(a.shape[0] * scale)), max(1, round(a.shape[1] * scale))
    small = np.asarray(Image.fromarray(a).resize((w, h), Image.Resampling.LANCZOS))
    cy, cx = ndimage.center_of_mass(small.astype(np.float32))
    top = min(max(round(14 - cy), 0), 28 - h)
    left = min(max(round(14 - cx), 0), 28 - w)
    out = np.zeros((28, 28), np.uint8)
    out[top : top + h, left : left + w] = small
    return out


def render_digits(per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    fonts = [f for f in _fonts() if "Display" not in f.name]
    labels = np.repeat(np.arange(10), per_class)
    images = np.stack([render_digit(int(d), fonts[rng.integers(len(fonts))], rng) for d in labels])
    return images, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--per-class", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    images, labels = render_digits(args.per_class, args.seed)
    (args.work / "rendered-grid.png").write_bytes(sample_grid(images, labels))  # a bundle's grid
    pool = public_pool()
    np.savez_compressed(
        args.work / "pool.npz",
        images=np.concatenate([pool.images, images]),
        labels=np.concatenate([pool.labels, labels]),
        class_names=np.array(pool.class_names),
    )
    os.environ["PRIVRELEASE_CACHE"] = str((args.work / "cache").resolve())
    from release import demo

    demo.DEMO_SPEC["privimage"]["public"] = str((args.work / "pool.npz").resolve())
    sys.argv = ["release.demo", "--workspace", str(args.work / "workspace")]
    demo.main()


if __name__ == "__main__":
    main()
