"""Writing and reading published bundles.

Layout: data/part-NNNNN.parquet (image struct {bytes: PNG, path}, label int64, id string, optional
extra columns, image ones as PNG structs too; the Hugging Face Image layout, so pyarrow, polars,
duckdb and `datasets` read it as is), sample_grid.png (a few images per class), croissant.json
(MLCommons Croissant with its Responsible-AI fields), README.md (the dataset card, with YAML front
matter for `datasets.load_dataset`), manifest.intoto.json (in-toto Statement over every other file,
release id included) and manifest.dsse.json (its DSSE envelope signed with the platform's release
key), plus `<bundle>.tar.gz` beside the directory, with the two manifest files first so that a
verifier can refuse unsigned members before reading them. Everything is deterministic: the same
inputs and key give byte-identical files and tarball. The bundle is built in a hidden staging
directory and renamed into place, so a crash never leaves a half bundle under the final name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from PIL import Image

from accounting.errors import DataFormatError, InvalidParameterError, PrivReleaseError, TamperError
from accounting.store import Workspace
from release import dsse, keys
from release.card import DEFAULT_LICENSE, finish_card, label_feature, split_front_matter
from release.card_croissant import CROISSANT_FILE, croissant_jsonld
from release.manifest import (
    ENVELOPE_FILE,
    STATEMENT_FILE,
    build_statement,
    file_sha256,
    statement_bytes,
    tool_info,
)
from release.predicate import ReleasePredicate

DATA_DIR = "data"
CARD_FILE = "README.md"
GRID_FILE = "sample_grid.png"
BASE_COLUMNS = ("image", "label", "id")
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
# about this much image data per Parquet row group: streams in small reads
ROW_GROUP_BYTES = 16 << 20
GRID_PER_CLASS, GRID_CLASSES = 8, 10


class BundleExistsError(PrivReleaseError, FileExistsError):
    """The bundle directory or tarball is already there; bundles are never overwritten."""


@dataclass(frozen=True)
class BundleInfo:
    path: Path  # the bundle directory
    tarball: Path  # <path>.tar.gz
    tarball_sha256: str
    manifest_digest: str  # sha256 of manifest.intoto.json (= the signed DSSE payload)
    key_id: str  # securesystemslib's default keyid of the release key (the DSSE keyid)
    public_key_path: Path  # the workspace's release.pub, to hand to consumers
    files: tuple[str, ...]  # the manifest subjects
    record_count: int


# ---------------------------------------------------------------- input checks


def _check_images(images: object) -> np.ndarray:
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        raise DataFormatError(
            "images must be a uint8 numpy array, got "
            f"{getattr(images, 'dtype', type(images).__name__)}; convert to 0-255 uint8 first."
        )
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if not (images.ndim == 3 or (images.ndim == 4 and images.shape[-1] == 3)):
        raise DataFormatError(
            f"images must be (N,H,W) grey or (N,H,W,3) RGB, got shape {images.shape}."
        )
    if images.shape[0] == 0 or 0 in images.shape:
        raise DataFormatError(
            f"images must hold at least one non-empty image, got shape {images.shape}."
        )
    return images


def _check_labels(labels: object, n: int) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) != n:
        raise DataFormatError(
            f"labels must be a 1-D array with one label per image ({n}), got shape {arr.shape}."
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise DataFormatError(f"labels must be integers, got dtype {arr.dtype}.")
    return arr.astype(np.int64)


def _check_ids(ids: object, n: int) -> list[str]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence | np.ndarray):
        raise DataFormatError("ids must be a list of strings, one per image.")
    ids = list(ids)
    if len(ids) != n:
        raise DataFormatError(f"ids must have one entry per image ({n}), got {len(ids)}.")
    if not all(isinstance(i, str) and i for i in ids):
        raise DataFormatError("every id must be a non-empty string.")
    if len(set(ids)) != n:
        raise DataFormatError("ids must be unique; consumers use them to refer to rows.")
    return ids


def _extra_arrays(extra: dict | None, n: int) -> dict[str, pa.Array]:
    out: dict[str, pa.Array] = {}
    for name, values in (extra or {}).items():
        if not isinstance(name, str) or not name.isidentifier() or name in BASE_COLUMNS:
            raise DataFormatError(
                f"extra column name {name!r} must be an identifier other than {BASE_COLUMNS}."
            )
        arr = np.asarray(values)
        if arr.dtype == np.uint8 and arr.ndim in (3, 4) and len(arr) == n:  # one image per row
            out[name] = _image_column(_check_images(arr))
            continue
        if arr.ndim not in (1, 2) or len(arr) != n:
            raise DataFormatError(
                f"extra column {name!r} must be 1-D or 2-D with {n} rows, got shape {arr.shape}."
            )
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise DataFormatError(f"extra column {name!r} holds NaN or infinite values.")
        if arr.dtype.kind not in "biuf" and not (arr.dtype.kind == "U" and arr.ndim == 1):
            raise DataFormatError(
                f"extra column {name!r} has unsupported dtype {arr.dtype}; use numbers or text."
            )
        if arr.ndim == 2:  # e.g. label_distribution: one list<float> per row
            out[name] = pa.array(list(arr), type=pa.list_(pa.from_numpy_dtype(arr.dtype)))
        else:
            out[name] = pa.array(arr)
    return out


def _image_column(images: np.ndarray) -> pa.Array:
    """An extra image column (e.g. an aligned crop per row): PNG structs like `image`."""
    return pa.StructArray.from_arrays(
        [
            pa.array([encode_png(im) for im in images], pa.binary()),
            pa.nulls(len(images), pa.string()),
        ],
        fields=list(IMAGE_TYPE),
    )


# ---------------------------------------------------------------- encoding


def encode_png(image: np.ndarray) -> bytes:
    """Deterministic PNG: mode L for (H,W), RGB for (H,W,3); no timestamps or text chunks."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(
        buf, format="PNG", compress_level=6, optimize=False
    )
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "PNG" or im.mode not in ("L", "RGB"):
                raise DataFormatError(
                    f"bundle image is {im.format} mode {im.mode}; expected a grey or RGB PNG."
                )
            return np.asarray(im.copy())
    except (OSError, SyntaxError, ValueError) as e:
        raise DataFormatError(f"bundle image could not be decoded as PNG ({e}).") from None


def _write_parquet(
    path: Path, ids: list[str], labels: np.ndarray, pngs: list[bytes], extra: dict[str, pa.Array]
) -> None:
    images = pa.StructArray.from_arrays(
        [pa.array(pngs, pa.binary()), pa.array([f"{i}.png" for i in ids])], fields=list(IMAGE_TYPE)
    )
    columns = {
        "image": images,
        "label": pa.array(labels, pa.int64()),
        "id": pa.array(ids, pa.string()),
    }
    columns.update(extra)
    mean_png = max(1, sum(map(len, pngs)) // max(1, len(pngs)))
    rows_per_group = int(min(10_000, max(100, ROW_GROUP_BYTES // mean_png)))
    pq.write_table(pa.table(columns), path, compression="zstd", row_group_size=rows_per_group)


def _features(labels: np.ndarray, extra: dict[str, pa.Array]) -> list[dict]:
    """Hugging Face feature list (YAML form) for the Parquet columns, in column order."""
    out = [
        {"name": "image", "dtype": "image"},
        label_feature(sorted({int(x) for x in labels})),
        {"name": "id", "dtype": "string"},
    ]
    for name, arr in extra.items():
        if arr.type == IMAGE_TYPE:
            out.append({"name": name, "dtype": "image"})
        elif pa.types.is_list(arr.type):
            out.append({"name": name, "sequence": _hf_dtype(arr.type.value_type)})
        else:
            out.append({"name": name, "dtype": _hf_dtype(arr.type)})
    return out


def _hf_dtype(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    return {"double": "float64", "float": "float32", "halffloat": "float16"}.get(str(t), str(t))


def sample_grid(images: np.ndarray, labels: np.ndarray) -> bytes:
    """PNG of up to 8 images for each of the first 10 classes (one row per class), 2-pixel gaps."""
    classes = sorted({int(x) for x in labels})[:GRID_CLASSES]
    h, w = images.shape[1:3]
    shape = (len(classes) * (h + 2), GRID_PER_CLASS * (w + 2)) + images.shape[3:]
    grid = np.zeros(shape, np.uint8)
    for r, c in enumerate(classes):
        for k, i in enumerate(np.flatnonzero(labels == c)[:GRID_PER_CLASS]):
            grid[r * (h + 2) + 1 : r * (h + 2) + 1 + h, k * (w + 2) + 1 : k * (w + 2) + 1 + w] = (
                images[i]
            )
    return encode_png(grid)


def _write_tarball(src: Path, arcroot: str, dest: Path) -> None:
    """Deterministic .tar.gz of `src` under top-level dir `arcroot`: mtime 0, owner 0, the signed
    manifest first (a verifier then refuses unsigned members from their headers), then the other
    files sorted."""

    def add(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
        info = tarfile.TarInfo(arcname)
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        if path.is_dir():
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        else:
            info.size, info.mode = path.stat().st_size, 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)

    def order(p: Path) -> tuple[int, str]:
        rel = p.relative_to(src).as_posix()
        return (0 if rel == ENVELOPE_FILE else 1 if rel == STATEMENT_FILE else 2), rel

    with (
        open(dest, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        add(tar, src, arcroot)
        for p in sorted(src.rglob("*"), key=order):
            add(tar, p, f"{arcroot}/{p.relative_to(src).as_posix()}")


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- public API


def write_bundle(
    out_dir: Path,
    *,
    images: np.ndarray,
    labels: np.ndarray,
    ids: list[str],
    card_markdown: str,
    predicate: dict | ReleasePredicate,
    workspace: Workspace,
    extra_columns: dict[str, np.ndarray] | None = None,
    rows_per_file: int = 5000,
    extra_files: dict[str, Path] | None = None,
) -> BundleInfo:
    """Write, sign and archive a bundle at `out_dir` (and `<out_dir>.tar.gz`); never overwrites.

    `predicate` is recorded as given, plus `tool` (name, version) when the caller did not set it and
    `release_id` (= the bundle's directory name, which verification binds to the signature). The
    card is completed with the data's features, the key fingerprints and the verify/recompute
    recipes. `extra_files` (bundle path -> file) are copied in as they are and signed like the
    rest, e.g. the files an output kind adds (release.kinds), one per row.
    """
    out_dir = Path(out_dir)
    if out_dir.name in ("", ".", ".."):
        raise InvalidParameterError(
            f"Bundle path {str(out_dir)!r} needs a final directory name, e.g. bundles/rel-1."
        )
    tar_path = out_dir.with_name(out_dir.name + ".tar.gz")
    images = _check_images(images)
    n = images.shape[0]
    labels, ids = _check_labels(labels, n), _check_ids(ids, n)
    extra = _extra_arrays(extra_columns, n)
    files = _check_extra_files(extra_files)
    _check_rows_and_card(rows_per_file, card_markdown)
    predicate = _complete_predicate(predicate, out_dir.name)
    _refuse_existing(out_dir, tar_path)
    pub_path = keys.ensure_release_key(workspace)
    signing_key = keys.load_private_key(workspace, keys.RELEASE_KEY)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        root = staging / out_dir.name
        num_bytes = _write_data(root, images, labels, ids, extra, rows_per_file)
        num_bytes += _copy_extra_files(root, files)
        features = _features(labels, extra)
        _write_croissant(root, out_dir.name, card_markdown, features, predicate)
        _write_card(root, card_markdown, features, n, num_bytes, signing_key, predicate)
        statement, payload, envelope = _sign(root, predicate, signing_key)
        staged_tar = staging / tar_path.name
        _write_tarball(root, out_dir.name, staged_tar)
        _self_check((root, staged_tar), pub_path)
        _place(root, staged_tar, out_dir, tar_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _bundle_info(out_dir, tar_path, pub_path, (statement, payload, envelope), n)


def _bundle_info(
    out_dir: Path, tar_path: Path, pub_path: Path, signed: tuple[dict, bytes, dict], n: int
) -> BundleInfo:
    """What was written and signed, read back from the placed tarball and the signed statement."""
    statement, payload, envelope = signed
    return BundleInfo(
        path=out_dir,
        tarball=tar_path,
        tarball_sha256=file_sha256(tar_path),
        manifest_digest=_sha256_bytes(payload),
        key_id=envelope["signatures"][0]["keyid"],
        public_key_path=pub_path,
        files=tuple(s["name"] for s in statement["subject"]),
        record_count=n,
    )


def _check_rows_and_card(rows_per_file: object, card_markdown: object) -> None:
    """Refuse a bad `rows_per_file` or an empty dataset card, before anything is written."""
    if (
        isinstance(rows_per_file, bool)
        or not isinstance(rows_per_file, Integral)
        or rows_per_file < 1
    ):
        raise InvalidParameterError(
            f"rows_per_file must be a positive integer, got {rows_per_file!r}."
        )
    if not isinstance(card_markdown, str) or not card_markdown.strip():
        raise DataFormatError("The dataset card (README.md) must be non-empty text.")


def _refuse_existing(out_dir: Path, tar_path: Path) -> None:
    """Bundles are never overwritten: refuse if the directory or its tarball exists."""
    for p in (out_dir, tar_path):
        if os.path.lexists(p):
            raise BundleExistsError(
                f"{p} already exists; bundles are never overwritten. Choose another output path or "
                "move the old bundle away."
            )


def _copy_extra_files(root: Path, files: dict[str, Path]) -> int:
    """Copy the checked extra files into the staged bundle; returns the bytes they add."""
    num_bytes = 0
    for name, src in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, root / name)
        num_bytes += (root / name).stat().st_size
    return num_bytes


def _write_card(
    root: Path,
    card_markdown: str,
    features: list[dict],
    n: int,
    num_bytes: int,
    signing_key: Ed25519PrivateKey,
    predicate: dict,
) -> None:
    """The completed dataset card (features, key fingerprints, recipes) as the bundle's README."""
    card = finish_card(
        card_markdown,
        release_id=root.name,
        features=features,
        n=n,
        num_bytes=num_bytes,
        key_fingerprints=dsse.key_ids(signing_key.public_key()),
        predicate=predicate,
    )
    (root / CARD_FILE).write_bytes(card.encode("utf-8"))


def _check_extra_files(extra_files: dict[str, Path] | None) -> dict[str, Path]:
    """Bundle-relative names (plain relative paths outside the bundle's own files) of regular
    files."""
    from release.manifest import safe_member_name

    out: dict[str, Path] = {}
    for name, src in (extra_files or {}).items():
        top = name.split("/")[0]
        if (
            not safe_member_name(name)
            or name in (CARD_FILE, GRID_FILE, CROISSANT_FILE)
            or (top == DATA_DIR and name.endswith(".parquet"))
        ):
            raise InvalidParameterError(f"extra bundle file name {name!r} is not allowed.")
        if not Path(src).is_file():
            raise DataFormatError(f"{src}: not a file; cannot put it in the bundle as {name}.")
        out[name] = Path(src)
    return out


def _complete_predicate(predicate: object, name: str) -> dict:
    if isinstance(predicate, ReleasePredicate):
        predicate = predicate.to_json()
    if not isinstance(predicate, dict):
        raise InvalidParameterError("The release predicate must be a dict (JSON object).")
    rid = predicate.get("release_id", name)
    if rid != name:
        raise InvalidParameterError(
            f"The bundle directory must be named after the release id ({rid!r}), got {name!r}: "
            "verification binds the signed release id to the bundle's name."
        )
    predicate = {**predicate, "release_id": rid, "tool": predicate.get("tool", tool_info())}
    # refuse NaN / non-JSON values before writing anything
    statement_bytes({"predicate": predicate})
    return predicate


def _write_data(
    root: Path,
    images: np.ndarray,
    labels: np.ndarray,
    ids: list[str],
    extra: dict[str, pa.Array],
    rows_per_file: int,
) -> int:
    """The Parquet parts and the sample grid; returns the total bytes of image data."""
    (root / DATA_DIR).mkdir(parents=True)
    total = 0
    for part, start in enumerate(range(0, len(ids), rows_per_file)):
        stop = min(start + rows_per_file, len(ids))
        pngs = [encode_png(images[i]) for i in range(start, stop)]
        total += sum(map(len, pngs))
        _write_parquet(
            root / DATA_DIR / f"part-{part:05d}.parquet",
            ids[start:stop],
            labels[start:stop],
            pngs,
            {k: v.slice(start, stop - start) for k, v in extra.items()},
        )
    (root / GRID_FILE).write_bytes(sample_grid(images, labels))
    return total


def _write_croissant(
    root: Path, release_id: str, card: str, features: list[dict], predicate: dict
) -> None:
    meta, body = split_front_matter(card)
    meta = {**meta, "license": meta.get("license") or DEFAULT_LICENSE}
    digests = {
        p.relative_to(root).as_posix(): file_sha256(p)
        for p in sorted((root / DATA_DIR).glob("*.parquet"))
    }
    doc = croissant_jsonld(
        root,
        release_id=release_id,
        meta=meta,
        body=body,
        features=features,
        predicate=predicate,
        digests=digests,
    )
    (root / CROISSANT_FILE).write_text(
        json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    )


def _sign(root: Path, predicate: dict, signing_key) -> tuple[dict, bytes, dict]:
    statement = build_statement(root, predicate)
    payload = statement_bytes(statement)
    (root / STATEMENT_FILE).write_bytes(payload)
    envelope = dsse.sign_envelope(payload, signing_key)
    (root / ENVELOPE_FILE).write_bytes(dsse.envelope_bytes(envelope))
    return statement, payload, envelope


def _self_check(targets: tuple[Path, ...], pub_path: Path) -> None:
    """Check the bundle as a consumer would, before anyone sees it."""
    from release.verify import verify_bundle

    for target in targets:
        result = verify_bundle(target, pub_path)
        if not result.ok:
            raise TamperError(
                "The bundle failed its own verification before publishing: "
                + "; ".join(result.problems)
            )


def _place(root: Path, staged_tar: Path, out_dir: Path, tar_path: Path) -> None:
    """Move the staged bundle into place; never replaces a bundle that appeared meanwhile."""
    try:
        # fails instead of replacing a tarball that appeared meanwhile
        os.link(staged_tar, tar_path)
    except FileExistsError:
        raise BundleExistsError(
            f"{tar_path} appeared while the bundle was being written; not replaced."
        ) from None
    try:
        if os.path.lexists(out_dir):
            raise BundleExistsError(
                f"{out_dir} appeared while the bundle was being written; not replaced."
            )
        os.rename(root, out_dir)
    except BaseException:
        tar_path.unlink(missing_ok=True)
        raise


def data_files(bundle_dir: Path) -> list[Path]:
    files = sorted((Path(bundle_dir) / DATA_DIR).glob("part-*.parquet"))
    if not files:
        raise DataFormatError(
            f"{bundle_dir} holds no {DATA_DIR}/part-*.parquet files; is it a privrelease bundle?"
        )
    return files


def read_bundle_table(bundle_dir: Path) -> pa.Table:
    """All rows of the bundle's Parquet files, in order (images still PNG bytes)."""
    try:
        return pa.concat_tables([pq.read_table(p) for p in data_files(bundle_dir)])
    except (pa.ArrowException, OSError) as e:
        raise DataFormatError(f"{bundle_dir}: the Parquet data could not be read ({e}).") from None


def read_bundle_data(
    bundle_dir: Path, *, public_key_path: Path | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (N,H,W) or (N,H,W,3), labels int64, ids). With `public_key_path`, verify the
    bundle first."""
    if public_key_path is not None:
        from release.verify import verify_bundle

        result = verify_bundle(Path(bundle_dir), Path(public_key_path))
        if not result.ok:
            raise TamperError(f"{bundle_dir} failed verification: " + "; ".join(result.problems))
    table = read_bundle_table(bundle_dir)
    missing = [c for c in BASE_COLUMNS if c not in table.column_names]
    if missing:
        raise DataFormatError(f"{bundle_dir}: Parquet data lacks column(s) {missing}.")
    column = table.column("image")
    if pa.types.is_struct(
        column.type
    ):  # {bytes, path}; bundles before it stored the PNG bytes directly
        column = pa.chunked_array([c.field("bytes") for c in column.chunks], pa.binary())
    decoded = [decode_png(b) for b in column.to_pylist()]
    if len({d.shape for d in decoded}) > 1:
        raise DataFormatError(f"{bundle_dir}: images have different shapes; cannot stack them.")
    images = np.stack(decoded) if decoded else np.zeros((0, 0, 0), np.uint8)
    return (
        images,
        np.asarray(table.column("label").to_numpy(), dtype=np.int64),
        table.column("id").to_pylist(),
    )
