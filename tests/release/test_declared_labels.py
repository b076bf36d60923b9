"""Issue 13 item 11: the label set is declared at registration (public) and never read off the data."""

import numpy as np
import pytest

from accounting import ledger
from accounting.errors import DataFormatError
from release.data import load_registered, register_from_source


def npz(path, labels, n_pixels=8):
    rng = np.random.default_rng(len(labels))
    np.savez(
        path,
        images=rng.integers(0, 255, (len(labels), n_pixels, n_pixels), dtype=np.uint8),
        labels=np.asarray(labels, dtype=np.int64),
    )
    return str(path)


def test_user_data_must_declare_its_labels(tmp_path, store):
    with pytest.raises(DataFormatError, match="no label set was declared.*--labels"):
        register_from_source(store, "d", npz(tmp_path / "d.npz", [0, 1, 0, 1]), 1.0, 1e-3)
    assert ledger.list_datasets(store) == []


def test_data_labels_must_be_within_the_declaration(tmp_path, store):
    with pytest.raises(
        DataFormatError, match=r"labels \[2\] that are not in the declared set \[0, 1\]"
    ):
        register_from_source(
            store, "d", npz(tmp_path / "d.npz", [0, 1, 2, 1]), 1.0, 1e-3, labels="0,1"
        )
    assert ledger.list_datasets(store) == []


def test_a_class_with_one_record_is_not_revealed(tmp_path, store):
    """Neighbouring datasets (one record of class 3 present or removed) register the same label set, and
    mechanisms receive the same classes to generate: the declaration, not the data."""
    base = [0, 1, 2] * 10
    with_one = npz(tmp_path / "with.npz", base + [3])
    without = npz(tmp_path / "without.npz", base)
    a, _ = register_from_source(store, "with-one", with_one, 1.0, 1e-3, labels="0-3")
    b, _ = register_from_source(store, "without", without, 1.0, 1e-3, labels="0-3")
    assert a.labels == b.labels == [0, 1, 2, 3]
    (_, da), (_, db) = load_registered(store, "with-one"), load_registered(store, "without")
    assert da.label_set == db.label_set == [0, 1, 2, 3]
    assert (
        da.class_names == db.class_names == ["0", "1", "2", "3"]
    )  # k-SALSA's label-distribution width
    assert db.observed_labels == [0, 1, 2]  # what the data alone would have said


def test_declaration_formats(tmp_path, store):
    ds, _ = register_from_source(
        store, "d", npz(tmp_path / "d.npz", [0, 5, 7]), 1.0, 1e-3, labels="0-4, 5,7"
    )
    assert ds.labels == [0, 1, 2, 3, 4, 5, 7]
    ds2, _ = register_from_source(
        store, "e", npz(tmp_path / "e.npz", [1, 2, 1]), 1.0, 1e-3, labels=[1, 2, 9]
    )
    assert ds2.labels == [1, 2, 9]
    with pytest.raises(DataFormatError, match="'cat' is not a label value"):
        register_from_source(
            store, "f", npz(tmp_path / "f.npz", [0, 1]), 1.0, 1e-3, labels="cat,dog"
        )


def test_folder_declares_its_class_subfolders(tmp_path, store):
    from PIL import Image

    root = tmp_path / "pets"
    for cls, n in (("cat", 2), ("dog", 1), ("emu", 0)):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((8, 8), 40 * i + 10, np.uint8)).save(root / cls / f"{i}.png")
    with pytest.raises(DataFormatError, match=r"Subfolders \['emu'\] are not declared"):
        register_from_source(store, "pets", str(root), 1.0, 1e-3, labels="cat,dog")
    with pytest.raises(DataFormatError, match=r"No subfolder for \['fox'\]"):
        register_from_source(store, "pets", str(root), 1.0, 1e-3, labels="cat,dog,emu,fox")
    assert ledger.list_datasets(store) == []
    ds, _ = register_from_source(store, "pets", str(root), 1.0, 1e-3, labels="emu,dog,cat")
    assert ds.labels == [0, 1, 2]  # emu (empty) is a declared class
    _, data = load_registered(store, "pets")
    assert data.class_names == ["cat", "dog", "emu"] and data.label_set == [0, 1, 2]


def test_builtins_declare_their_labels(store):
    ds, _ = register_from_source(store, "mnist", "builtin:mnist5k", 1.0, 1e-5)
    assert ds.labels == list(range(10))
    with pytest.raises(DataFormatError, match="not in the declared set"):
        register_from_source(store, "mnist-low", "builtin:mnist5k", 1.0, 1e-5, labels="0-4")


@pytest.mark.slow
def test_release_uses_the_declaration_and_names_its_count(tmp_path, store):
    """A real k-SALSA release of data without any 9s, declared 0-9: the label-distribution column has the
    declared width (10), and the signed predicate counts released images under an honest name."""
    from release import artifacts, keys, manager
    from release.bundle import read_bundle_data
    from release.spec import ReleaseSpec
    from release.verify import verify_bundle
    from synth.kinds.datasets import load_source

    mnist = load_source("builtin:mnist5k")
    idx = np.concatenate([np.flatnonzero(mnist.labels == c)[:7] for c in range(9)])
    np.savez(tmp_path / "no9.npz", images=mnist.images[idx], labels=mnist.labels[idx])
    keys.create_identity(store, "alice", "steward")
    keys.ensure_release_key(store.workspace)
    register_from_source(store, "no9", str(tmp_path / "no9.npz"), 4.0, 1e-4, labels="0-9")
    policy = {
        "feature_samples": 60,
        "fid_samples": 60,
        "utility_train_samples": 60,
        "cnn_epochs": 1,
        "min_utility_gain": None,
    }  # the utility gate is tested elsewhere; 63 images cannot pass it
    spec = ReleaseSpec.from_dict(
        {
            "release": {
                "dataset": "no9",
                "mechanism": "ksalsa",
                "heldout": "builtin:mnist5k-heldout",
            },
            "ksalsa": {"k": 3, "preset": "tiny", "public": "builtin:uci-digits"},
            "policy": policy,
        }
    )
    rel = manager.create_plan(store, spec, "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest, acknowledge_non_dp=True)
    manager.run_release(store, rel.release_id, "alice")
    images, _, dist = artifacts.load_release_data(store, rel.release_id)
    assert dist.shape == (len(images), 10)
    published = manager.publish(store, rel.release_id, "alice")
    bundle = published.result.bundle
    v = verify_bundle(bundle["tarball"], keys.public_key_path(store.workspace, "release"))
    assert v.ok, v.problems
    assert (
        v.predicate["released_image_count"] == len(images) == 63 // 3
        and "record_count" not in v.predicate
    )
    assert set(read_bundle_data(bundle["path"])[1]) <= set(range(10))
