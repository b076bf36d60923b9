"""User data loading: folders, Parquet, NumPy; bad input is a clear error and registers nothing."""

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from accounting.errors import DataFormatError
from release.data import register_from_source
from synth.kinds.datasets import load_source, uci_digits
from synth.kinds.user_data import to_uint8


def png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "imgs" / cls / f"{i}.png").write_bytes(
                png(rng.integers(0, 255, (8, 8), dtype=np.uint8))
            )
    return tmp_path / "imgs"


def test_folder_of_class_subfolders(folder):
    d = load_source(str(folder))
    assert (
        d.images.shape == (6, 8, 8)
        and d.class_names == ["cat", "dog"]
        and list(d.labels) == [0, 0, 0, 1, 1, 1]
    )


def test_corrupt_image_is_named(folder, store):
    (folder / "dog" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataFormatError, match="broken.png: not a readable image"):
        register_from_source(store, "pets", str(folder), 1.0, 1e-3, labels="cat,dog")
    assert (
        store.query("SELECT * FROM datasets") == []
        and store.query("SELECT * FROM audit_trail") == []
    )


def test_wrong_shaped_image_is_named(folder):
    (folder / "cat" / "big.png").write_bytes(png(np.zeros((16, 16), dtype=np.uint8)))
    with pytest.raises(DataFormatError, match="different sizes.*big.png is 16x16"):
        load_source(str(folder))


def test_empty_folder(tmp_path):
    (tmp_path / "e").mkdir()
    with pytest.raises(DataFormatError, match="one subfolder per class"):
        load_source(str(tmp_path / "e"))


def test_parquet_round_trip_and_missing_column(tmp_path):
    rng = np.random.default_rng(1)
    images = [png(rng.integers(0, 255, (8, 8), dtype=np.uint8)) for _ in range(4)]
    pq.write_table(pa.table({"image": images, "label": [0, 1, 0, 1]}), tmp_path / "ok.parquet")
    assert load_source(str(tmp_path / "ok.parquet")).images.shape == (4, 8, 8)
    pq.write_table(pa.table({"img": images}), tmp_path / "bad.parquet")
    with pytest.raises(DataFormatError, match="missing column"):
        load_source(str(tmp_path / "bad.parquet"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFormatError, match="not a readable Parquet"):
        load_source(str(tmp_path / "junk.parquet"))


@pytest.mark.parametrize(
    "bad,match",
    [
        (np.full((3, 4, 4), np.nan), "NaN"),
        (-np.ones((3, 4, 4)), "negative"),
        (np.full((3, 4, 4), 300.0), "above 255"),
    ],
)
def test_numpy_bad_pixels(tmp_path, bad, match):
    np.savez(tmp_path / "x.npz", images=bad, labels=np.zeros(3, dtype=int))
    with pytest.raises(DataFormatError, match=match):
        load_source(str(tmp_path / "x.npz"))


def test_numpy_float_pixels_are_scaled_and_labels_checked(tmp_path):
    assert to_uint8(np.array([[0.0, 1.0]]), "x").tolist() == [[0, 255]]
    # integers are 0-255 values: a binary 0/1 integer image is not stretched to 0/255
    assert to_uint8(np.array([[0, 1]], dtype=np.int64), "x").tolist() == [[0, 1]]
    np.savez(tmp_path / "y.npz", images=np.zeros((3, 4, 4), dtype=np.uint8), labels=np.zeros(2))
    with pytest.raises(DataFormatError, match="labels of shape"):
        load_source(str(tmp_path / "y.npz"))
    np.savez(tmp_path / "z.npz", pictures=np.zeros((3, 4, 4)))
    with pytest.raises(DataFormatError, match="`images` and `labels`"):
        load_source(str(tmp_path / "z.npz"))


def test_unknown_sources():
    with pytest.raises(DataFormatError, match="Unknown built-in"):
        load_source("builtin:imagenet")
    with pytest.raises(DataFormatError, match="no such file"):
        load_source("/nonexistent/data")


def test_uci_digits_are_framed_like_mnist():
    """MNIST centres each digit in a 20x20 box on a black 28x28 frame; the public UCI digits must match,
    or a prior learnt from them does not transfer (stretched to the full frame, a CNN scores ~13% on MNIST)."""
    digits, mnist = uci_digits(), load_source("builtin:mnist5k-heldout")
    assert digits.images.shape == (1797, 28, 28) and digits.images.dtype == np.uint8
    border = np.ones((28, 28), bool)
    border[4:24, 4:24] = False
    assert digits.images[:, border].max() == 0
    assert digits.images[:, 4:24, 4:24].mean() > 60  # the digit fills its box
    # overall brightness within a factor 1.5 of MNIST's (it was 2.3x when stretched)
    assert 1 / 1.5 < digits.images.mean() / mnist.images.mean() < 1.5


def test_parquet_with_image_struct_as_bundles_write_it(tmp_path):
    """Bundles store `image` as a struct {bytes, path} (the Hugging Face layout): it registers like bytes."""
    rng = np.random.default_rng(2)
    arrays = [rng.integers(0, 255, (8, 8), dtype=np.uint8) for _ in range(3)]
    image = pa.StructArray.from_arrays(
        [pa.array([png(a) for a in arrays], pa.binary()), pa.array(["0.png", "1.png", "2.png"])],
        names=["bytes", "path"],
    )
    pq.write_table(pa.table({"image": image, "label": [0, 1, 1]}), tmp_path / "b.parquet")
    d = load_source(str(tmp_path / "b.parquet"))
    assert np.array_equal(d.images, np.stack(arrays)) and d.labels.tolist() == [0, 1, 1]
