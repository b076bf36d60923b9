"""Reading user data: a folder of class subfolders, Parquet (`image` bytes + `label`) or NumPy
`.npz`.

Sizes are checked from headers (image headers, the .npy headers inside an .npz, the Parquet schema)
before anything is decoded, so a hostile file cannot make us allocate gigabytes. Every problem is a
DataFormatError naming the file and the fix; nothing is registered from a source that fails here.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from PIL import Image

from accounting.errors import DataFormatError
from synth.kinds.decoding import decoding
from synth.kinds.image_dataset import MAX_LABEL, ImageDataset, check_label_values

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
MAX_SIDE = 4096  # pixels per image side
MAX_VALUES = 1 << 30  # decoded pixel values of a whole dataset (1 GiB as uint8)
MAX_NAME = 200  # characters in one class name of an .npz `class_names` array
CHUNK = 4096  # images converted to uint8 at a time (bounds the float64 copy)


def load_user_source(source: str) -> ImageDataset:
    path = Path(source)
    if not path.exists():
        raise DataFormatError(f"{source}: no such file or folder.")
    if path.is_dir():
        return load_folder(path)
    if path.suffix.lower() == ".parquet":
        return load_parquet(path)
    if path.suffix.lower() == ".npz":
        return load_numpy(path)
    raise DataFormatError(
        f"{source}: unsupported format; use a folder of class subfolders, .parquet or .npz."
    )


# ----------------------------------------------------------------- size checks
def check_geometry(shape: tuple[int, ...], count: int, where: str) -> None:
    """Refuse empty sides, other channel counts than 1 or 3, huge images and huge datasets."""
    h, w = shape[0], shape[1]
    channels = shape[2] if len(shape) == 3 else 1
    if h < 1 or w < 1:
        raise DataFormatError(f"{where}: an image of {w}x{h} pixels has no pixels; remove it.")
    if channels not in (1, 3):
        raise DataFormatError(
            f"{where}: images have {channels} channels; give grey (1) or RGB (3) images."
        )
    if max(h, w) > MAX_SIDE:
        raise DataFormatError(
            f"{where}: an image of {w}x{h} pixels exceeds the limit of {MAX_SIDE} per side; "
            "downscale the images first (the mechanisms work at 28-64 pixels)."
        )
    if count * h * w * channels > MAX_VALUES:
        raise DataFormatError(
            f"{where}: {count} images of {w}x{h}x{channels} exceed the limit of {MAX_VALUES:,} "
            "pixel values; downscale the images or register a subset."
        )


def _open(data: bytes | Path, where: str) -> Image.Image:
    """Open an image lazily: only the header is read, so its size can be checked before decoding."""
    with decoding(where):
        return Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)


def printable(path: str | Path) -> str:
    """A path as a message can print it: a name that is not UTF-8 (its bytes kept by the file
    system) shows those bytes escaped instead of breaking the terminal or the store."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_utf8_name(path: str | Path, what: str = "name") -> None:
    """Refuse a path that is not valid UTF-8: the store keeps text, and a name it cannot hold would
    fail only once the ledger writes it."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise DataFormatError(
            f"{printable(path)}: its {what} is not valid UTF-8 (the bytes escaped here). Rename "
            "it in UTF-8 (e.g. `convmv -f latin1 -t utf8 --notest -r PATH`, or by hand) and "
            "register again. Nothing was registered."
        ) from None


def _rawmode(im: Image.Image) -> str:
    """How the file stores its pixels (e.g. 'RGB;16B' for a 16-bit RGB PNG, which Pillow decodes
    to 8-bit 'RGB' silently)."""
    for tile in getattr(im, "tile", None) or ():
        args = tile.args if hasattr(tile, "args") else tile[3]
        raw = args if isinstance(args, str) else (args[0] if args else "")
        if isinstance(raw, str):
            return raw
    return ""


def check_header(im: Image.Image, where: str) -> None:
    """Refuse what would be registered other than it is, from the header alone: 16/32-bit or float
    pixels (clipped or cut to 8 bits silently) and several frames (only the first would be kept).
    A camera's MPO file (the photo and a preview) is one photo: its first frame is the photo."""
    if im.mode.startswith(("I", "F")):  # 16/32-bit or float pixels would be clipped to 255 silently
        raise DataFormatError(
            f"{where}: {im.mode} pixels (16/32-bit or float); convert the images to 8-bit grey "
            "or RGB first, scaling the intensities yourself."
        )
    if ";16" in _rawmode(im) or ";32" in _rawmode(im):
        raise DataFormatError(
            f"{where}: {_rawmode(im)} pixels (16 bits per channel), which would be cut to 8 "
            "bits silently; convert the image to 8-bit RGB first, scaling the intensities "
            "yourself (e.g. `magick FILE -depth 8 OUT.png`)."
        )
    frames = int(getattr(im, "n_frames", 1) or 1)
    if frames > 1 and im.format != "MPO":
        raise DataFormatError(
            f"{where}: {frames} frames (an animation or a multi-page file), but one file is one "
            "image and only its first frame would be registered. Save the frame(s) you mean as "
            "separate files (e.g. `magick 'FILE[0]' OUT.png`) and register again."
        )


def check_opaque(im: Image.Image, where: str) -> None:
    """Refuse an image whose transparency hides pixels: made RGB, the hidden pixels would be
    registered (and released) as if they were seen. Fully opaque alpha is fine. `im` is loaded."""
    if im.mode not in ("RGBA", "LA", "PA", "RGBa", "La") and "transparency" not in im.info:
        return
    alpha = np.asarray(im.convert("RGBA").getchannel("A"))
    hidden = int(np.count_nonzero(alpha < 255))
    if hidden:
        raise DataFormatError(
            f"{where}: {hidden} of {alpha.size} pixels are transparent or translucent; what they "
            "hide would be registered as if it were visible. Flatten the image onto a background "
            "first (e.g. `magick FILE -background white -flatten -alpha off OUT.png`, or export it "
            "without transparency) and register again."
        )


def _probe(data: bytes | Path, where: str) -> tuple[tuple[int, int], tuple[int, ...]]:
    """(width, height) and the decoded shape, from the header alone (the file is closed again)."""
    with decoding(where), _open(data, where) as im:
        check_header(im, where)  # reading the frames can fail in the decoder (a truncated GIF)
        w, h = im.size
        return (w, h), ((h, w) if im.mode in ("L", "1") else (h, w, 3))


def _decode(data: bytes | Path, where: str) -> np.ndarray:
    """Decode one image; grey (H, W) when all channels agree, else RGB (H, W, 3)."""
    with decoding(where), _open(data, where) as im:
        im.load()
        check_opaque(im, where)
        if im.mode in ("L", "1"):
            return np.asarray(im.convert("L"), dtype=np.uint8)
        rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    grey = (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()
    return rgb[..., 0].copy() if grey else rgb


def _decode_all(items: Sequence[bytes | Path], names: list[str], where: str) -> np.ndarray:
    """Check every header (one size, within the limits), then decode; (N, H, W) or (N, H, W, 3)."""
    probes = [_probe(item, name) for item, name in zip(items, names, strict=True)]
    for (_, shape), name in zip(probes, names, strict=True):
        check_geometry(shape, len(items), name)
    sizes = [p[0] for p in probes]
    if len(set(sizes)) > 1:
        odd = next(i for i, s in enumerate(sizes) if s != sizes[0])
        raise DataFormatError(
            f"{where}: images have different sizes; e.g. {names[odd]} is "
            f"{sizes[odd][0]}x{sizes[odd][1]} while {names[0]} is {sizes[0][0]}x{sizes[0][1]}. "
            "Resize all images to one size first."
        )
    arrays = [_decode(item, name) for item, name in zip(items, names, strict=True)]
    if any(a.ndim == 3 for a in arrays):
        arrays = [np.repeat(a[..., None], 3, -1) if a.ndim == 2 else a for a in arrays]
    return np.stack(arrays)


# ----------------------------------------------------------------- folders
def _inside(path: Path, root: Path, where: str) -> Path:
    """Refuse a symlink that leads out of the registered folder (the data would not be what was
    named)."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop
        raise DataFormatError(f"{where}: a broken link ({exc}); remove it.") from exc
    if real != root and root not in real.parents:
        raise DataFormatError(
            f"{where}: a link to {real}, outside the folder {root}. "
            "Copy the file into the folder or remove the link."
        )
    return real


def load_folder(path: Path) -> ImageDataset:
    """A folder with one subfolder per class (sorted names -> labels 0..K-1), images inside. An
    empty subfolder is a class with no images; hidden entries are ignored."""
    check_utf8_name(path, "folder name")
    root = path.resolve()
    subdirs = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_dir())
    if not subdirs:
        raise DataFormatError(
            f"{path}: expected one subfolder per class containing images; found none."
        )
    files, labels = [], []
    for label, sub in enumerate(subdirs):
        check_utf8_name(sub, "class folder's name")
        _inside(sub, root, str(sub))
        for f in sorted(sub.iterdir()):
            if f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith("."):
                check_utf8_name(f, "file name")
                real = _inside(f, root, str(f))
                if not real.is_file():  # a folder or a pipe named *.png: opening a pipe would block
                    raise DataFormatError(
                        f"{f}: not a regular file; remove it or rename it without an image suffix."
                    )
                files.append(real)
                labels.append(label)
    classes = [p.name for p in subdirs]
    if not files:
        raise DataFormatError(
            f"{path}: class folders {classes} contain no images "
            f"({', '.join(sorted(IMAGE_SUFFIXES))})."
        )
    images = _decode_all(files, [str(f) for f in files], str(path))
    return ImageDataset(images, np.array(labels, dtype=np.int64), classes, str(path))


# ----------------------------------------------------------------- Parquet
def load_parquet(path: Path) -> ImageDataset:
    """Parquet with columns `image` (encoded bytes, e.g. PNG) and `label` (int); our bundle
    format."""
    meta = _checked_parquet(path)
    table = meta.read(columns=["image", "label"])
    if table.column("image").null_count or table.column("label").null_count:
        raise DataFormatError(
            f"{path}: some images or labels are null; every "
            "row needs an image and an integer label."
        )
    labels = check_label_values(table.column("label").to_numpy(), str(path))
    images = _image_bytes(path, table)
    return ImageDataset(
        _decode_all(images, [f"{path} row {i}" for i in range(len(images))], str(path)),
        labels,
        [],
        str(path),
    )


def _checked_parquet(path: Path) -> Any:
    """The Parquet file, opened; refused unless it has an `image` column of encoded bytes and an
    integer `label` column, some rows, and column data within MAX_VALUES."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
        schema = meta.schema_arrow
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataFormatError(f"{path}: not a readable Parquet file ({exc}).") from exc
    missing = {"image", "label"} - set(schema.names)
    if missing:
        raise DataFormatError(
            f"{path}: missing column(s) {sorted(missing)}; "
            "need `image` (PNG bytes) and `label` (int)."
        )
    if _bytes_type(schema.field("image").type) is None:
        raise DataFormatError(
            f"{path}: column `image` is {schema.field('image').type}; "
            "it must hold encoded image bytes (binary, e.g. PNG, or a "
            "struct {bytes, path} as our bundles write), one per row."
        )
    if not pa.types.is_integer(schema.field("label").type):
        raise DataFormatError(
            f"{path}: column `label` is {schema.field('label').type}; labels must be integer class "
            "indices 0..K-1 (declare the classes at registration)."
        )
    if meta.metadata.num_rows == 0:
        raise DataFormatError(f"{path}: the file has no rows; nothing to register.")
    md = meta.metadata
    stored = sum(
        md.row_group(g).column(c).total_uncompressed_size
        for g in range(md.num_row_groups)
        for c in range(md.num_columns)
    )
    if stored > MAX_VALUES:
        raise DataFormatError(
            f"{path}: {stored:,} bytes of column data exceed the limit of {MAX_VALUES:,}; register "
            "a subset or smaller images."
        )
    return meta


def _image_bytes(path: Path, table: Any) -> list:
    """The encoded bytes of every row's image (from our bundles' {bytes, path} structs too);
    refused if one has none."""
    import pyarrow as pa

    column = table.column("image")
    if pa.types.is_struct(
        column.type
    ):  # {bytes, path}: the Hugging Face image layout of our bundles
        column = pa.chunked_array(
            [c.field("bytes") for c in column.chunks], column.type.field("bytes").type
        )
    if column.null_count:
        raise DataFormatError(
            f"{path}: some images have no bytes; every row needs an encoded image."
        )
    return column.to_pylist()


def _bytes_type(t):
    """The binary type holding the encoded image: the column itself, or the `bytes` field of a
    struct."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        idx = t.get_field_index("bytes")
        return _bytes_type(t.field(idx).type) if idx >= 0 else None
    return t if pa.types.is_binary(t) or pa.types.is_large_binary(t) else None


# ----------------------------------------------------------------- NumPy
def _npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f".npy format version {version} is not supported; save with numpy.savez")
    return shape, dtype


def _npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    try:
        with zipfile.ZipFile(path) as z:
            return {n[:-4]: _npy_header(z.open(n)) for n in z.namelist() if n.endswith(".npy")}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as exc:
        raise DataFormatError(
            f"{path}: not a readable .npz file ({exc or type(exc).__name__}). Save the arrays with "
            "numpy.savez(path, images=..., labels=...)."
        ) from exc


def _check_npz_arrays(path: Path, headers: dict) -> None:
    if "images" not in headers or "labels" not in headers:
        raise DataFormatError(
            f"{path}: needs arrays named `images` and `labels`; found {sorted(headers)}."
        )
    (shape, dtype), (lshape, ldtype) = headers["images"], headers["labels"]
    if dtype.kind not in "uif":
        raise DataFormatError(
            f"{path}: image array has dtype {dtype}; pixels must be real numbers (uint8 0-255, or "
            "floats in [0, 1] or [0, 255])."
        )
    if len(shape) not in (3, 4) or shape[0] == 0:
        raise DataFormatError(
            f"{path}: `images` has shape {shape}; expected a non-empty (N, H, W) or (N, H, W, C)."
        )
    check_geometry(tuple(shape[1:]), shape[0], str(path))
    if lshape != (shape[0],):
        raise DataFormatError(f"{path}: {shape[0]} images but labels of shape {lshape}.")
    check_label_values(np.zeros(0, ldtype), str(path))  # the dtype alone: text, complex, ...
    if "class_names" in headers:
        nshape, ndtype = headers["class_names"]
        if ndtype.kind not in "U" or len(nshape) != 1:
            raise DataFormatError(
                f"{path}: `class_names` is a {ndtype} array of shape {nshape}; give a 1-D array of "
                "strings, one per label value, e.g. numpy.array(['cat', 'dog'])."
            )
        if not 1 <= nshape[0] <= MAX_LABEL + 1 or ndtype.itemsize // 4 > MAX_NAME:
            raise DataFormatError(
                f"{path}: `class_names` holds {nshape[0]} names of up to {ndtype.itemsize // 4} "
                f"characters; give 1 to {MAX_LABEL + 1} names of at most {MAX_NAME} characters."
            )


SAVE_HINT = "numpy.savez(path, images=..., labels=..., class_names=numpy.array([...]))"


def _class_names(names: np.ndarray, labels: np.ndarray, where: str) -> list[str]:
    """`class_names[v]` names label value v: one per value up to the largest label, each a distinct
    non-empty string."""
    out = [str(n).strip() for n in names.tolist()]
    top = int(labels.max())
    if len(out) <= top:
        raise DataFormatError(
            f"{where}: `class_names` has {len(out)} names but the labels go up to {top}; name "
            f"every label value 0..{top} in order (class_names[v] is the name of label v)."
        )
    empty = [i for i, n in enumerate(out) if not n]
    if empty:
        raise DataFormatError(
            f"{where}: `class_names` entries {empty[:10]} are empty; give every class a name."
        )
    repeated = sorted({n for n in out if out.count(n) > 1})
    if repeated:
        raise DataFormatError(
            f"{where}: `class_names` repeats {repeated[:5]}; give each class its own name."
        )
    return out


def load_numpy(path: Path) -> ImageDataset:
    """.npz with arrays `images` (N,H,W[,C], uint8 or floats in [0,1] / [0,255]), `labels` (int)
    and, optionally, `class_names` (strings: class_names[v] names label value v)."""
    headers = _npz_headers(path)
    _check_npz_arrays(path, headers)
    try:
        with np.load(path, allow_pickle=False) as data:
            images, labels = data["images"], data["labels"]
            names = data["class_names"] if "class_names" in headers else None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataFormatError(
            f"{path}: not a readable .npz file ({exc}). Save it with {SAVE_HINT}."
        ) from exc
    if images.ndim == 4 and images.shape[3] == 1:
        images = images[..., 0]
    labels = check_label_values(labels, str(path))
    class_names = [] if names is None else _class_names(names, labels, str(path))
    return ImageDataset(to_uint8(images, str(path)), labels, class_names, str(path))


def to_uint8(images: np.ndarray, where: str) -> np.ndarray:
    """uint8 pixels. Integers are taken as 0-255; floats as [0, 1] (scaled) or [0, 255]."""
    if images.dtype == np.uint8:
        return images
    if images.dtype.kind not in "uif":
        raise DataFormatError(
            f"{where}: image array has dtype {images.dtype}; pixels must be real numbers."
        )
    lo, hi = images.min(), images.max()
    if images.dtype.kind == "f" and not (np.isfinite(lo) and np.isfinite(hi)):
        raise DataFormatError(f"{where}: images contain NaN or infinite values; clean them first.")
    if lo < 0:
        raise DataFormatError(f"{where}: negative pixel values; give pixels in [0, 1] or [0, 255].")
    scale = 255.0 if images.dtype.kind == "f" and hi <= 1.0 else 1.0
    if hi * scale > 255.0 + 1e-6:
        raise DataFormatError(
            f"{where}: pixel values above 255; give pixels in [0, 1] or [0, 255]."
        )
    out = np.empty(images.shape, np.uint8)
    for start in range(0, len(images), CHUNK):  # chunks: no float64 copy of the whole array
        out[start : start + CHUNK] = np.rint(
            images[start : start + CHUNK].astype(np.float64) * scale
        )
    return out
