"""Issue 13 item 7: every bad data source is a clear error, in bounded memory, and registers nothing."""

import io
import os
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from accounting import ledger
from accounting.errors import DataFormatError
from release.data import register_from_source

REPO = Path(__file__).resolve().parents[2]


def png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def named(tmp: Path, class_names) -> Path:
    np.savez(tmp / "d.npz", images=U8, labels=np.array([0, 1, 0]), class_names=class_names)
    return tmp / "d.npz"


def npz(tmp: Path, images, labels) -> Path:
    np.savez(tmp / "d.npz", images=np.asarray(images), labels=np.asarray(labels))
    return tmp / "d.npz"


def parquet(tmp: Path, table: pa.Table) -> Path:
    pq.write_table(table, tmp / "d.parquet")
    return tmp / "d.parquet"


def class_folder(tmp: Path) -> Path:
    for cls in ("cat", "dog"):
        (tmp / "imgs" / cls).mkdir(parents=True)
        (tmp / "imgs" / cls / "0.png").write_bytes(png(np.full((8, 8), 7, np.uint8)))
    return tmp / "imgs"


def symlinked_file(tmp: Path) -> Path:
    root = class_folder(tmp)
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / "secret.png").write_bytes(png(np.zeros((8, 8), np.uint8)))
    (root / "cat" / "1.png").symlink_to(tmp / "elsewhere" / "secret.png")
    return root


def symlinked_class(tmp: Path) -> Path:
    root = class_folder(tmp)
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / "0.png").write_bytes(png(np.zeros((8, 8), np.uint8)))
    (root / "bird").symlink_to(tmp / "elsewhere", target_is_directory=True)
    return root


def huge_png(tmp: Path) -> Path:
    big = png(np.zeros((5000, 5000), np.uint8))  # 25 MB decoded, a few KB encoded
    for cls in ("cat", "dog"):
        (tmp / "imgs" / cls).mkdir(parents=True)
        (tmp / "imgs" / cls / "big.png").write_bytes(big)
    return tmp / "imgs"


def sixteen_bit(tmp: Path) -> Path:
    for cls in ("cat", "dog"):
        (tmp / "imgs" / cls).mkdir(parents=True)
        Image.new("I;16", (8, 8), 40000).save(
            tmp / "imgs" / cls / "0.png"
        )  # once clipped to 255: all white
    return tmp / "imgs"


def pipe_named_png(tmp: Path) -> Path:
    root = class_folder(tmp)
    os.mkfifo(root / "cat" / "1.png")  # opening it would wait forever for a writer
    return root


U8 = np.zeros((3, 8, 8), np.uint8)
CASES = {
    "string labels (npz)": (lambda t: npz(t, U8, ["cat", "dog", "cat"]), "0,1", "got text"),
    "string labels (parquet)": (
        lambda t: parquet(t, pa.table({"image": [png(U8[0])] * 2, "label": ["a", "b"]})),
        "0,1",
        "column `label` is string",
    ),
    "empty parquet": (
        lambda t: parquet(
            t, pa.table({"image": pa.array([], pa.binary()), "label": pa.array([], pa.int64())})
        ),
        "0,1",
        "no rows",
    ),
    "integer image column": (
        lambda t: parquet(t, pa.table({"image": [1, 2], "label": [0, 1]})),
        "0,1",
        "column `image` is int64",
    ),
    "zero-byte npz": (
        lambda t: (t / "d.npz").write_bytes(b"") or t / "d.npz",
        "0,1",
        "not a readable .npz",
    ),
    "zero-width images": (
        lambda t: npz(t, np.zeros((3, 0, 8), np.uint8), [0, 1, 0]),
        "0,1",
        "has no pixels",
    ),
    "7 channels": (
        lambda t: npz(t, np.zeros((3, 8, 8, 7), np.uint8), [0, 1, 0]),
        "0,1",
        "7 channels",
    ),
    "complex pixels": (
        lambda t: npz(t, np.zeros((3, 8, 8), np.complex128), [0, 1, 0]),
        "0,1",
        "complex128",
    ),
    "NaN label": (lambda t: npz(t, U8, [0.0, np.nan, 1.0]), "0,1", "whole numbers, got nan"),
    "fractional label": (lambda t: npz(t, U8, [0.0, 0.5, 1.0]), "0,1", "whole numbers, got 0.5"),
    "negative label": (lambda t: npz(t, U8, [0, -1, 1]), "0,1", "non-negative"),
    "label 1e12": (lambda t: npz(t, U8, [0, 10**12, 1]), "0,1", "above the limit"),
    "image 5000x5000 (png)": (huge_png, "cat,dog", "5000x5000 pixels exceeds the limit"),
    "symlinked image out of the folder": (symlinked_file, "cat,dog", "outside the folder"),
    "16-bit png": (sixteen_bit, "cat,dog", "I;16 pixels"),
    "pipe named like an image": (pipe_named_png, "cat,dog", "not a regular file"),
    "object-dtype labels": (
        lambda t: (
            np.savez(t / "d.npz", images=U8, labels=np.array([0, 1, None], dtype=object))
            or t / "d.npz"
        ),
        "0,1",
        "labels must be integer class indices, got dtype object",
    ),
    "symlinked class folder out of the folder": (
        symlinked_class,
        "bird,cat,dog",
        "outside the folder",
    ),
    # optional `class_names` of an .npz (issue 36): strings, one per label value, distinct, non-empty
    "class_names too short": (
        lambda t: named(t, ["cat"]),
        "0,1",
        "has 1 names but the labels go up to 1",
    ),
    "class_names of numbers": (
        lambda t: named(t, np.array([3, 4])),
        "0,1",
        "int64 array.*1-D array of strings",
    ),
    "class_names 2-D": (lambda t: named(t, np.array([["cat", "dog"]])), "0,1", r"shape \(1, 2\)"),
    "class_names empty entry": (
        lambda t: named(t, ["cat", " "]),
        "0,1",
        r"entries \[1\] are empty",
    ),
    "class_names repeated": (lambda t: named(t, ["cat", "cat"]), "0,1", r"repeats \['cat'\]"),
    "class_names as objects": (
        lambda t: named(t, np.array(["cat", "dog"], dtype=object)),
        "0,1",
        "object array.*1-D array of strings",
    ),
    "class_names of 300 characters": (
        lambda t: named(t, ["cat", "d" * 300]),
        "0,1",
        "at most 200 characters",
    ),
}


def assert_nothing_registered(store) -> None:
    assert ledger.list_datasets(store) == []
    assert store.query("SELECT * FROM audit_trail") == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_source_is_a_clear_error_and_registers_nothing(case, tmp_path, store):
    build, labels, match = CASES[case]
    source = build(tmp_path)
    with pytest.raises(DataFormatError, match=match):
        register_from_source(store, "bad", str(source), 1.0, 1e-3, labels=labels)
    assert_nothing_registered(store)


def _npz_claiming(path: Path, shape: tuple[int, ...], payload_bytes: int) -> None:
    """A real .npz whose images are all-zero uint8 of `shape`, streamed: tiny on disk, huge once loaded."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("images.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "|u1", "fortran_order": False, "shape": shape}
            )
            chunk = bytes(1 << 24)
            for start in range(0, payload_bytes, len(chunk)):
                f.write(chunk[: min(len(chunk), payload_bytes - start)])
        with z.open("labels.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros(shape[0], np.int64))


def test_16000x16000_npz_is_refused_from_its_header(tmp_path, store):
    """The size is read from the .npy header inside the .npz: the 256 MB array is never loaded."""
    path = tmp_path / "huge.npz"
    _npz_claiming(path, (1, 16000, 16000), 16000 * 16000)
    tracemalloc.start()
    try:
        with pytest.raises(DataFormatError, match="16000x16000 pixels exceeds the limit"):
            register_from_source(store, "huge", str(path), 1.0, 1e-3, labels="0")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB while refusing"
    assert_nothing_registered(store)


def test_label_1e12_is_refused_in_bounded_memory(tmp_path):
    """Under a 1.5 GiB address-space limit: a label of 1e12 once sized a per-class list (5.4 GB)."""
    path = npz(tmp_path, U8, [0, 10**12, 1])
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))
        from accounting.errors import DataFormatError
        from synth.kinds.datasets import load_source
        try:
            load_source({str(path)!r})
        except DataFormatError as exc:
            print("REFUSED", exc)
    """)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert "REFUSED" in out.stdout and "above the limit" in out.stdout, out.stderr[-2000:]


def test_declared_label_range_is_bounded_before_building_it(store, tmp_path):
    path = npz(tmp_path, U8, [0, 1, 0])
    with pytest.raises(DataFormatError, match="not within 0..9999"):
        register_from_source(store, "d", str(path), 1.0, 1e-3, labels="0-1000000000000")
    assert_nothing_registered(store)


def test_symlink_inside_the_folder_is_fine(tmp_path, store):
    root = class_folder(tmp_path)
    (root / "dog" / "1.png").symlink_to(root / "cat" / "0.png")
    ds, _ = register_from_source(store, "pets", str(root), 1.0, 1e-3, labels="cat,dog")
    assert ds.record_count == 3


# ----------------------------------------------------------------- the CLI: markup in paths
@pytest.fixture
def privrelease(capsys, monkeypatch):
    """The command line's entry point as `python -m release.cli` runs it (its error printing
    included), in this process: run(workspace, *args) -> (exit code, stdout, stderr). A rich
    MarkupError would propagate out of it."""
    from release.cli import main
    from release.terminal import console, err_console

    for printer in (console, err_console):  # wide enough for the table's source column
        monkeypatch.setattr(printer, "_width", 200)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() installs ours

    def run(ws: Path, *args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["privrelease", "--workspace", str(ws), *args])
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main()
        out = capsys.readouterr()
        return int(stop.value.code or 0), out.out, out.err

    return run


def test_paths_with_brackets_are_shown_verbatim(tmp_path, privrelease):
    """`x[/y]` was read by rich as a closing tag: a MarkupError traceback instead of the message."""
    ws = tmp_path / "ws"
    assert privrelease(ws, "init", "--steward", "alice")[0] == 0
    (tmp_path / "a[").mkdir()
    register = ("dataset", "register")
    budget = ("--epsilon", "1", "--delta", "1e-3", "--as", "alice")
    for source in (str(tmp_path / "x[/y]"), str(tmp_path / "a[")):
        code, _, err = privrelease(ws, *register, "d", "--source", source, "--labels", "0", *budget)
        assert code == 2 and "Traceback" not in err, err[-2000:]
        assert source in err.replace("\n", "")
    root = class_folder(tmp_path / "b[bold]")
    code, _, err = privrelease(
        ws, *register, "pets", "--source", str(root), "--labels", "cat,dog", *budget
    )
    assert code == 0, err
    code, out, err = privrelease(ws, "dataset", "list")
    assert code == 0 and "b[bold]" in out, out + err


def test_parquet_size_is_checked_from_its_metadata(tmp_path, store, monkeypatch):
    """The stored column sizes are read from the footer before any row is read or decoded."""
    from synth.kinds import user_data

    rng = np.random.default_rng(0)
    images = [png(rng.integers(0, 255, (8, 8), dtype=np.uint8)) for _ in range(20)]
    path = parquet(tmp_path, pa.table({"image": images, "label": [0, 1] * 10}))
    monkeypatch.setattr(user_data, "MAX_VALUES", 1000)
    with pytest.raises(DataFormatError, match="bytes of column data exceed the limit of 1,000"):
        register_from_source(store, "big", str(path), 1.0, 1e-3, labels="0,1")
    assert_nothing_registered(store)


def test_npz_class_names_name_the_classes(tmp_path, store):
    from release.data import load_registered

    np.savez(
        tmp_path / "d.npz",
        images=U8,
        labels=np.array([0, 2, 0]),
        class_names=np.array(["cat", "dog", "emu"]),
    )
    ds, _ = register_from_source(store, "named", str(tmp_path / "d.npz"), 1.0, 1e-3, labels="0-3")
    _, data = load_registered(store, "named")
    assert data.class_names == [
        "cat",
        "dog",
        "emu",
        "3",
    ]  # a declared class with no name keeps its number
    np.savez(tmp_path / "plain.npz", images=U8, labels=np.array([0, 1, 0]))
    ds, _ = register_from_source(
        store, "plain", str(tmp_path / "plain.npz"), 1.0, 1e-3, labels="0,1"
    )
    assert load_registered(store, "plain")[1].class_names == [
        "0",
        "1",
    ]  # without the array: numbers, as before
