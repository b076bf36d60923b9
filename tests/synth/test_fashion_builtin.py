"""Issue 12 item 4: Fashion-MNIST (Debian dataset-fashion-mnist) as a built-in sensitive dataset, with its
test split held out for the audit, and a public set that never contains it when it is the sensitive one."""

import hashlib

import numpy as np
import pytest

from accounting.errors import DataFormatError, PrivReleaseError
from release.data import load_registered, register_from_source
from synth.kinds import datasets
from synth.kinds.datasets import (
    check_public_disjoint,
    fashion_available,
    heldout_source,
    load_public,
    load_source,
)

needs_fashion = pytest.mark.skipif(
    not fashion_available(), reason="apt package dataset-fashion-mnist is not installed"
)


@needs_fashion
def test_fashion_mnist_splits_and_registration(store):
    train, test = load_source("builtin:fashion-mnist"), load_source("builtin:fashion-mnist-test")
    assert train.images.shape == (60000, 28, 28) and test.images.shape == (10000, 28, 28)
    assert train.label_set == test.label_set == list(range(10))
    assert (
        np.bincount(train.labels).tolist() == [6000] * 10 and train.class_names[9] == "Ankle boot"
    )
    assert heldout_source("builtin:fashion-mnist") == "builtin:fashion-mnist-test"
    with pytest.raises(PrivReleaseError, match="not below 1/n"):
        register_from_source(
            store, "fashion", "builtin:fashion-mnist", 10.0, 1e-4
        )  # 1/60000 = 1.7e-5
    ds, _ = register_from_source(store, "fashion", "builtin:fashion-mnist", 10.0, 1e-6)
    assert ds.record_count == 60000 and ds.labels == list(range(10))
    assert load_registered(store, "fashion")[1].class_names[0] == "T-shirt/top"


def test_missing_package_is_a_clear_error(tmp_path, monkeypatch, store):
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "FASHION_DIR", tmp_path / "absent")
    with pytest.raises(DataFormatError, match="apt-get install dataset-fashion-mnist"):
        register_from_source(store, "fashion", "builtin:fashion-mnist", 10.0, 1e-6)
    assert store.query("SELECT * FROM datasets") == []
    assert not fashion_available()
    assert load_source("builtin:public-pool").source == "builtin:public-pool(digits)"


def test_damaged_package_is_a_clear_error(tmp_path, monkeypatch):
    import gzip

    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(b"\x00" * 32)
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "FASHION_DIR", tmp_path)
    with pytest.raises(DataFormatError, match="not an IDX file.*--reinstall"):
        load_source("builtin:fashion-mnist")


def _digests(images: np.ndarray) -> set[bytes]:
    return {hashlib.sha256(im.tobytes()).digest() for im in images}


@needs_fashion
def test_public_set_is_disjoint_from_fashion_when_it_is_sensitive():
    for public in ("builtin:public-pool", "builtin:fashion-mnist", "builtin:fashion-mnist-test"):
        with pytest.raises(
            DataFormatError, match='Fashion-MNIST.*disjoint.*public = "builtin:uci-digits"'
        ):
            check_public_disjoint(public, "builtin:fashion-mnist")
    public = load_public("builtin:uci-digits", "builtin:fashion-mnist")
    fashion = _digests(load_source("builtin:fashion-mnist").images) | _digests(
        load_source("builtin:fashion-mnist-test").images
    )
    assert not _digests(public.images) & fashion
    # with MNIST sensitive, the default 20-class pool (digits + Fashion-MNIST) stays allowed
    pool = load_public("builtin:public-pool", "builtin:mnist5k")
    assert len(pool.label_set) == 20 and _digests(pool.images) & fashion
    with pytest.raises(DataFormatError, match="MNIST"):
        check_public_disjoint("builtin:mnist5k-heldout", "builtin:mnist5k")
    with pytest.raises(DataFormatError, match="the sensitive dataset itself"):
        check_public_disjoint("/data/x.npz", "/data/x.npz")


@needs_fashion
def test_plan_with_fashion_sensitive_refuses_the_default_pool(store):
    """Refused at plan time, before any budget is reserved; with UCI digits as the public set it plans."""
    from accounting import ledger
    from release import keys, manager
    from release.spec import ReleaseSpec

    keys.create_identity(store, "alice", "steward")
    register_from_source(store, "fashion", "builtin:fashion-mnist", 10.0, 1e-6)
    spec = {
        "release": {"dataset": "fashion", "mechanism": "privimage", "n_images": 100},
        "privimage": {"epsilon": 4.0, "preset": "tiny"},
    }
    with pytest.raises(DataFormatError, match="contains Fashion-MNIST"):
        manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    assert ledger.budget(store, "fashion").charges == [] and manager.list_releases(store) == []
    spec["privimage"]["public"] = "builtin:uci-digits"
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    assert rel.plan.dataset == "fashion"


def _write_idx(folder, n: int, opener) -> None:
    rng = np.random.default_rng(1)
    with opener(folder / "train-images-idx3-ubyte.xz", "wb") as f:
        f.write(
            (2051).to_bytes(4, "big")
            + b"".join(d.to_bytes(4, "big") for d in (n, 28, 28))
            + rng.integers(0, 256, n * 784).astype(np.uint8).tobytes()
        )
    with opener(folder / "train-labels-idx1-ubyte.xz", "wb") as f:
        f.write(
            (2049).to_bytes(4, "big")
            + n.to_bytes(4, "big")
            + (np.arange(n) % 10).astype(np.uint8).tobytes()
        )


def test_data_dir_env_var_is_read_first_and_xz_files_load(tmp_path, monkeypatch):
    """PRIVRELEASE_DATA_DIR with xz files (as gpu_lease.sh stages them) wins over the Debian package's folder:
    a 30-image copy there is what loads, whatever /usr/share holds."""
    import lzma

    _write_idx(tmp_path, 30, lzma.open)
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    assert datasets.fashion_dirs()[0] == tmp_path and fashion_available()
    train = load_source("builtin:fashion-mnist")
    assert train.images.shape == (30, 28, 28) and train.labels.tolist()[:11] == list(range(10)) + [
        0
    ]
    assert train.label_set == list(range(10))


def test_without_the_files_anywhere_the_error_names_the_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "staged"))
    monkeypatch.setattr(datasets, "FASHION_DIR", tmp_path / "absent")
    with pytest.raises(
        DataFormatError,
        match=f"{tmp_path / 'staged'} or {tmp_path / 'absent'}.*PRIVRELEASE_DATA_DIR",
    ):
        load_source("builtin:fashion-mnist-test")
    assert not fashion_available()


def test_damaged_xz_file_is_a_clear_error(tmp_path, monkeypatch):
    for name in ("train-images-idx3-ubyte.xz", "train-labels-idx1-ubyte.xz"):
        (tmp_path / name).write_bytes(b"not xz at all")
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(DataFormatError, match="unreadable.*PRIVRELEASE_DATA_DIR"):
        load_source("builtin:fashion-mnist")
