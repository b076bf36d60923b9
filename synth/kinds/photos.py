"""Photographs of any size as one dataset: `photos:DIR` (or `photos-SIZE:DIR`).

Every image of DIR (a flat folder: one class, "photo"; or one subfolder per class) is turned
upright (EXIF orientation), converted to RGB, scaled to fit SIZE x SIZE (default 512) keeping its
aspect ratio, and centred on a black square (letterboxing). The registered dataset is those squares:
uint8 (N, SIZE, SIZE, 3), one shape, as every mechanism, the fingerprint and the Parquet bundle
expect; the originals stay where they are and are never changed. The same folder and size always
give the same pixels, so the fingerprint checked at every run is stable.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from accounting.errors import DataFormatError
from synth.kinds.decoding import decoding
from synth.kinds.image_dataset import ImageDataset
from synth.kinds.user_data import (
    IMAGE_SUFFIXES,
    MAX_VALUES,
    _inside,
    _open,
    check_header,
    check_opaque,
    check_utf8_name,
    printable,
)

PREFIX = re.compile(r"^photos(?:-(\d+))?:(.+)$", re.DOTALL)
DEFAULT_SIZE = 512
MIN_SIZE, MAX_SIZE = 64, 2048
MAX_PHOTO_SIDE = 20_000  # pixels per side of one original (PIL's bomb check bounds the area too)
FLAT_CLASS = "photo"


def is_photos(source: str) -> bool:
    return PREFIX.match(source) is not None


def parse(source: str) -> tuple[Path, int]:
    """(folder, size) of a `photos:` source."""
    m = PREFIX.match(source)
    if m is None:
        raise DataFormatError(
            f"{source}: not a photos source; write photos:DIR or photos-SIZE:DIR."
        )
    size = int(m.group(1)) if m.group(1) else DEFAULT_SIZE
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise DataFormatError(
            f"{source}: the photo size must be between {MIN_SIZE} and {MAX_SIZE} pixels, "
            f"got {size}."
        )
    return Path(m.group(2)), size


def _files(folder: Path) -> tuple[list[Path], list[int], list[str]]:
    """Image files with their class (flat folder: one class; else one subfolder per class)."""
    check_utf8_name(folder, "folder name")  # the source is stored in the ledger as text
    root = folder.resolve()
    entries = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".")]
    subdirs = [p for p in entries if p.is_dir()]
    loose = [p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if subdirs and loose:
        raise DataFormatError(
            f"{folder}: holds both photos ({loose[0].name}, ...) and subfolders "
            f"({subdirs[0].name}, ...). Put every photo in one flat folder (one class), or all "
            "of them in class subfolders."
        )
    groups = [(FLAT_CLASS, folder)] if not subdirs else [(p.name, p) for p in subdirs]
    files, labels = [], []
    for label, (_, where) in enumerate(groups):
        check_utf8_name(where, "class folder's name")  # a class name, shown in cards
        _inside(where, root, str(where))
        for f in sorted(where.iterdir()):
            if f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith("."):
                check_utf8_name(f, "file name")
                real = _inside(f, root, str(f))
                if not real.is_file():
                    raise DataFormatError(
                        f"{f}: not a regular file; remove it or rename it without an image suffix."
                    )
                files.append(real)
                labels.append(label)
    if not files:
        raise DataFormatError(f"{folder}: no photos found ({', '.join(sorted(IMAGE_SUFFIXES))}).")
    return files, labels, [name for name, _ in groups]


def letterbox(path: Path, size: int) -> np.ndarray:
    """One photo upright, RGB, fitted into size x size and centred on black: uint8 (size, size,
    3)."""
    with warnings.catch_warnings():  # Pillow's notes on damaged metadata: our message says it
        warnings.simplefilter("ignore")
        return _letterbox(path, size, printable(path))


def _letterbox(path: Path, size: int, where: str) -> np.ndarray:
    with decoding(where), _open(path, where) as im:  # a damaged file can fail anywhere in it
        w, h = im.size
        if max(w, h) > MAX_PHOTO_SIDE:
            raise DataFormatError(
                f"{where}: a photo of {w}x{h} pixels exceeds the limit of {MAX_PHOTO_SIDE} per "
                "side; downscale it first."
            )
        check_header(im, where)
        im.draft("RGB", (size, size))  # JPEG: decode at a reduced scale, much faster
        im.load()
        check_opaque(im, where)
        upright = _upright(im, where).convert("RGB")
        fitted = ImageOps.pad(upright, (size, size), Image.Resampling.LANCZOS, color=(0, 0, 0))
    return np.asarray(fitted, dtype=np.uint8)


# EXIF orientation -> the turn that makes the photo upright (as Pillow's exif_transpose)
_ORIENTATION = 0x0112
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _upright(im: Image.Image, where: str) -> Image.Image:
    """The photo turned by its EXIF orientation. Not ImageOps.exif_transpose: that re-serialises
    the rest of the EXIF block, and crashes on malformed tags that have nothing to do with the
    turn. EXIF that cannot be parsed at all leaves which way is up unknown: refused."""
    try:
        orientation = im.getexif().get(_ORIENTATION, 1)
    except Exception as exc:
        raise DataFormatError(
            f"{where}: its EXIF metadata is damaged ({type(exc).__name__}: {exc}), so which way "
            "is up is unknown. Save the photo again upright and without metadata (e.g. `exiftool "
            "-all= FILE`, or export it from an image editor) and register again."
        ) from exc
    method = _UPRIGHT.get(orientation) if isinstance(orientation, int) else None
    return im.transpose(method) if method is not None else im


def load_photos(source: str) -> ImageDataset:
    folder, size = parse(source)
    if not folder.is_dir():
        raise DataFormatError(
            f"{printable(folder)}: no such folder (from the source {printable(source)!r})."
        )
    files, labels, classes = _files(folder)
    if len(files) * size * size * 3 > MAX_VALUES:
        raise DataFormatError(
            f"{source}: {len(files)} photos at {size}x{size} exceed the limit of {MAX_VALUES:,} "
            "pixel values; register a smaller size (photos-256:DIR) or a subset."
        )
    images = np.stack([letterbox(f, size) for f in files])
    return ImageDataset(images, np.array(labels, dtype=np.int64), classes, source)
