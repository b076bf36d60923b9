"""The public head templates, read from the packages that ship them (nothing is downloaded).

- pydeface's average head (`mean_reg2mean.nii.gz`, a full head with a face, 1 x 0.98 x 0.98 mm) and
  its face mask (`facemask.nii.gz`: 0 on the face, 1 elsewhere), from the PyPI package pydeface;
- Colin27, one subject scanned 27 times and averaged (`ch2.nii.gz`, 1 mm; its field of view cuts
  off the nose and mouth), and its brain (`ch2bet.nii.gz`, skull stripped), from the Debian
  package mricron-data (/usr/share/mricron/templates), or from `$PRIVRELEASE_DATA_DIR/mricron`.

`builtin:head-templates` is these four as one public `VolumeDataset` (masks as 0/1 uint8, 1 on the
face or brain); its content hash binds them into every volume release's signed plan.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import ndimage

from accounting.errors import DataFormatError
from synth.kinds.nifti import read_volume
from synth.kinds.volume import Volume, VolumeDataset

SOURCE = "builtin:head-templates"
FACE_HEAD = "pydeface-mean-head"  # the average head whose face refacing puts in place
FACE_MASK = "pydeface-face"  # 1 on its face (pydeface's mask inverted)
COLIN_HEAD = "colin27-head"
COLIN_BRAIN = "colin27-brain"  # 1 inside Colin27's brain
NAMES = (FACE_HEAD, FACE_MASK, COLIN_HEAD, COLIN_BRAIN)
MRICRON_DIR = Path("/usr/share/mricron/templates")
DATA_DIR_ENV = "PRIVRELEASE_DATA_DIR"


def pydeface_files() -> tuple[Path, Path]:
    """(average head, face mask) inside the installed pydeface package."""
    try:
        from importlib.resources import files

        data = Path(str(files("pydeface") / "data"))
    except ModuleNotFoundError as exc:
        raise DataFormatError(
            "The pydeface template ships in the Python package pydeface, which is not installed "
            f"({exc}). Install it: `pip install pydeface`."
        ) from exc
    head, mask = data / "mean_reg2mean.nii.gz", data / "facemask.nii.gz"
    if not (head.is_file() and mask.is_file()):
        raise DataFormatError(
            f"pydeface is installed but {data} lacks mean_reg2mean.nii.gz or facemask.nii.gz; "
            "reinstall it: `pip install --force-reinstall pydeface`."
        )
    return head, mask


def colin_dirs() -> list[Path]:
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    return ([Path(env).expanduser() / "mricron"] if env else []) + [MRICRON_DIR]


def colin_files() -> tuple[Path, Path]:
    """(Colin27 head, Colin27 brain) from the first folder that has both."""
    for folder in colin_dirs():
        head, brain = folder / "ch2.nii.gz", folder / "ch2bet.nii.gz"
        if head.is_file() and brain.is_file():
            return head, brain
    where = " or ".join(str(d) for d in colin_dirs())
    raise DataFormatError(
        f"Colin27 (ch2.nii.gz, ch2bet.nii.gz) is not installed in {where}. Install the Debian "
        "package as root: `apt-get install mricron-data`, or copy the two files into "
        f"${DATA_DIR_ENV}/mricron."
    )


def colin_available() -> bool:
    try:
        colin_files()
        pydeface_files()
    except DataFormatError:
        return False
    return True


def _mask(vol: Volume, data: np.ndarray, name: str) -> Volume:
    return Volume(data.astype(np.uint8), vol.affine, name=name)


@lru_cache(maxsize=1)
def head_templates() -> VolumeDataset:
    """The four public template volumes (module docstring), read once per process."""
    head_file, mask_file = pydeface_files()
    colin_file, brain_file = colin_files()
    face_head = read_volume(head_file, FACE_HEAD)
    keep = read_volume(mask_file, FACE_MASK)
    colin = read_volume(colin_file, COLIN_HEAD)
    bet = read_volume(brain_file, COLIN_BRAIN)
    # ch2bet is skull stripped, with holes along sulci: its filled, closed support is the brain
    brain = ndimage.binary_fill_holes(ndimage.binary_closing(bet.data > 0, iterations=2))
    return VolumeDataset(
        [face_head, _mask(keep, keep.data < 0.5, FACE_MASK), colin, _mask(bet, brain, COLIN_BRAIN)],
        SOURCE,
        list(NAMES),
    )
