"""Real photographs for the face tests (helpers, not tests): portraits that ship inside installed
packages (scikit-image's astronaut, Eileen Collins; matplotlib's Grace Hopper), a photo of a cup
with no face, and a photo with both women side by side (two faces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def astronaut() -> np.ndarray:
    import skimage.data

    return skimage.data.astronaut()


def grace_hopper() -> np.ndarray:
    from matplotlib import cbook

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as im:
        return np.asarray(im.convert("RGB"))


def no_face() -> np.ndarray:
    import skimage.data

    return skimage.data.coffee()


def two_faces() -> np.ndarray:
    """Both portraits' faces, side by side (256 x 512)."""
    return np.concatenate([astronaut()[20:276, 100:356], grace_hopper()[120:376, 140:396]], 1)


def write_folder(folder: Path, *, with_no_face: bool = True, with_two_faces: bool = True) -> Path:
    """A flat folder of photos of different sizes and formats (PNG and JPEG)."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(astronaut()).save(folder / "a_astronaut.png")
    Image.fromarray(grace_hopper()).save(folder / "b_grace_hopper.jpg", quality=95)
    if with_no_face:
        Image.fromarray(no_face()).save(folder / "c_coffee.png")
    if with_two_faces:
        Image.fromarray(two_faces()).save(folder / "d_two_faces.png")
    return folder
