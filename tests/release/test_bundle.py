"""Writing and reading bundles: Parquet/PNG layout, manifest subjects, determinism, refusal paths."""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from accounting.errors import DataFormatError, InvalidParameterError, PrivReleaseError
from accounting.store import Workspace
from release import dsse
from release.bundle import (
    BundleExistsError,
    decode_png,
    encode_png,
    read_bundle_data,
    read_bundle_table,
    write_bundle,
)
from release.manifest import PREDICATE_TYPE, STATEMENT_TYPE, file_sha256

PREDICATE = {
    "mechanism": "privimage",
    "guarantee": {"epsilon_rdp": 1.0, "delta": 1e-5},
    "audits": {"duplicates": "pass"},
}


@pytest.fixture
def ws(tmp_path) -> Workspace:
    w = Workspace(tmp_path / "ws")
    w.init()
    return w


def _data(n=12, shape=(8, 8), seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, (n, *shape), dtype=np.uint8),
        rng.integers(0, 10, n),
        [f"rec-{i:04d}" for i in range(n)],
    )


def _write(ws, out, n=12, shape=(8, 8), **kw):
    images, labels, ids = _data(n, shape)
    args = dict(
        images=images,
        labels=labels,
        ids=ids,
        card_markdown="# Card\nsynthetic\n",
        predicate=PREDICATE,
        workspace=ws,
    )
    args.update(kw)
    return write_bundle(out, **args), (images, labels, ids)


def test_bundle_layout_round_trip_and_manifest(ws, tmp_path):
    info, (images, labels, ids) = _write(ws, tmp_path / "out" / "rel-1", n=12, rows_per_file=5)
    root = info.path
    assert (
        root.is_dir()
        and info.tarball == tmp_path / "out" / "rel-1.tar.gz"
        and info.tarball.is_file()
    )
    parts = sorted(p.name for p in (root / "data").iterdir())
    assert parts == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    t = pq.read_table(root / "data" / "part-00000.parquet")
    assert t.schema.field("id").type == "string" and t.schema.field("label").type == "int64"
    assert t.schema.field("image").type == pa.struct(
        [("bytes", pa.binary()), ("path", pa.string())]
    )
    assert t.num_rows == 5 and t.column("image")[0]["path"].as_py() == "rec-0000.png"
    card = (root / "README.md").read_text()
    assert card.startswith("---\nlicense: other\n") and "# Card\nsynthetic\n" in card

    got_images, got_labels, got_ids = read_bundle_data(root, public_key_path=info.public_key_path)
    assert got_images.dtype == np.uint8 and np.array_equal(got_images, images)
    assert np.array_equal(got_labels, labels) and got_ids == ids

    statement = json.loads((root / "manifest.intoto.json").read_bytes())
    assert statement["_type"] == STATEMENT_TYPE and statement["predicateType"] == PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert (
        set(subjects)
        == {"README.md", "croissant.json", "sample_grid.png", *(f"data/{p}" for p in parts)}
        == set(info.files)
    )
    assert all(subjects[n] == file_sha256(root / n) for n in subjects)
    assert statement["predicate"]["mechanism"] == "privimage"
    assert statement["predicate"]["tool"]["name"] == "privrelease"  # tool version added
    assert statement["predicate"]["release_id"] == "rel-1"  # bound to the bundle's name
    assert info.manifest_digest == file_sha256(root / "manifest.intoto.json")
    assert info.tarball_sha256 == file_sha256(info.tarball)
    assert info.key_id == dsse.sslib_keyid(ws.keys / "release.pub") and info.record_count == 12
    # No staging leftovers next to the bundle.
    assert sorted(os.listdir(tmp_path / "out")) == ["rel-1", "rel-1.tar.gz"]


def test_rgb_and_extra_columns(ws, tmp_path):
    dist = np.random.default_rng(1).dirichlet(np.ones(10), size=6)
    info, (images, _, _) = _write(
        ws, tmp_path / "rgb", n=6, shape=(5, 7, 3), extra_columns={"label_distribution": dist}
    )
    got, _, _ = read_bundle_data(info.path)
    assert got.shape == (6, 5, 7, 3) and np.array_equal(got, images)
    table = read_bundle_table(info.path)
    dist_type = table.schema.field("label_distribution").type
    assert pa.types.is_list(dist_type) and dist_type.value_type == pa.float64()
    assert np.allclose(np.array(table.column("label_distribution").to_pylist()), dist)


def test_png_encoding_modes_and_determinism():
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8)
    rgb = np.stack([grey, grey[::-1], grey.T], axis=-1)
    assert encode_png(grey) == encode_png(grey.copy())
    assert encode_png(grey)[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.array_equal(decode_png(encode_png(grey)), grey)
    assert np.array_equal(decode_png(encode_png(rgb)), rgb)
    with pytest.raises(DataFormatError):
        decode_png(b"not a png")


def test_bundles_are_deterministic(ws, tmp_path):
    a, _ = _write(ws, tmp_path / "a" / "rel", rows_per_file=4)
    b, _ = _write(ws, tmp_path / "b" / "rel", rows_per_file=4)
    for name in a.files + ("manifest.intoto.json", "manifest.dsse.json"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes(), name
    assert a.tarball_sha256 == b.tarball_sha256 and a.manifest_digest == b.manifest_digest
    with tarfile.open(a.tarball) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    # The signed manifest comes first, so a verifier refuses unsigned members from their headers.
    assert names[:3] == ["rel", "rel/manifest.dsse.json", "rel/manifest.intoto.json"]
    assert names[3:] == sorted(names[3:])
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
    assert not any(m.issym() or m.islnk() for m in members)


def test_refuses_to_overwrite(ws, tmp_path):
    info, _ = _write(ws, tmp_path / "rel")
    before = {p: p.read_bytes() for p in info.path.rglob("*") if p.is_file()}
    tar_before = info.tarball.read_bytes()
    with pytest.raises(BundleExistsError, match="already exists"):
        _write(ws, tmp_path / "rel", n=3)
    assert {p: p.read_bytes() for p in info.path.rglob("*") if p.is_file()} == before
    assert info.tarball.read_bytes() == tar_before
    # A stray tarball of the same name also blocks the write (the pair must match).
    (tmp_path / "other.tar.gz").write_bytes(b"x")
    with pytest.raises(BundleExistsError):
        _write(ws, tmp_path / "other")
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(images=np.zeros((3, 8, 8), np.float32)), DataFormatError),
        (dict(images=np.zeros((3, 8), np.uint8)), DataFormatError),
        (dict(images=np.zeros((3, 8, 8, 4), np.uint8)), DataFormatError),
        (
            dict(images=np.zeros((0, 8, 8), np.uint8), labels=np.zeros(0, int), ids=[]),
            DataFormatError,
        ),
        (dict(labels=np.zeros(2, int)), DataFormatError),
        (dict(labels=np.zeros(3, float)), DataFormatError),
        (dict(ids=["a", "a", "b"]), DataFormatError),
        (dict(ids=["a", "", "b"]), DataFormatError),
        (dict(ids=["a", "b"]), DataFormatError),
        (dict(card_markdown="  "), DataFormatError),
        (dict(rows_per_file=0), InvalidParameterError),
        (dict(predicate={"epsilon": float("nan")}), InvalidParameterError),
        (dict(predicate={"epsilon": np.float32(1.0)}), InvalidParameterError),
        (dict(extra_columns={"label": np.zeros(3)}), DataFormatError),
        (dict(extra_columns={"dist": np.zeros((2, 10))}), DataFormatError),
        (dict(extra_columns={"dist": np.full((3, 10), np.inf)}), DataFormatError),
    ],
)
def test_bad_inputs_are_refused_and_leave_nothing(ws, tmp_path, change, error):
    args = dict(
        images=np.zeros((3, 8, 8), np.uint8),
        labels=np.arange(3),
        ids=["a", "b", "c"],
        card_markdown="# c",
        predicate={"m": 1},
        workspace=ws,
    )
    args.update(change)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(error) as exc:
        write_bundle(out / "rel", **args)
    assert isinstance(exc.value, PrivReleaseError) and str(exc.value)
    assert list(out.iterdir()) == []


def test_failure_mid_write_leaves_no_half_bundle(ws, tmp_path, monkeypatch):
    import release.bundle as bundle_mod

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(
        bundle_mod, "_write_tarball", fail
    )  # after the data and manifest were written
    (tmp_path / "out").mkdir()
    with pytest.raises(OSError, match="disk full"):
        _write(ws, tmp_path / "out" / "rel")
    assert list((tmp_path / "out").iterdir()) == []


def test_read_bundle_data_refuses_tampered_bundle_when_key_given(ws, tmp_path):
    info, _ = _write(ws, tmp_path / "rel")
    (info.path / "README.md").write_text("# edited card\n")
    read_bundle_data(info.path)  # without a key: the caller chose not to verify
    with pytest.raises(PrivReleaseError, match="README.md: sha256 mismatch"):
        read_bundle_data(info.path, public_key_path=info.public_key_path)


def test_an_extra_image_column_is_png_like_the_image_column(ws, tmp_path):
    """A mechanism's extra images (face-deid: each photo's aligned face) become a PNG column that
    `datasets` and Croissant read as images."""
    crops = np.random.default_rng(1).integers(0, 256, (12, 6, 6, 3), dtype=np.uint8)
    info, _ = _write(ws, tmp_path / "rel-x", extra_columns={"face": crops})
    t = read_bundle_table(info.path)
    assert t.schema.field("face").type == t.schema.field("image").type
    faces = [decode_png(r["bytes"]) for r in t.column("face").to_pylist()]
    assert np.array_equal(np.stack(faces), crops)
    card = (info.path / "README.md").read_text()
    assert "- name: face\n    dtype: image" in card
    croissant = json.loads((info.path / "croissant.json").read_text())
    fields = {f["name"]: f for f in croissant["recordSet"][0]["field"]}
    assert fields["face"]["dataType"] == fields["image"]["dataType"] == "sc:ImageObject"
