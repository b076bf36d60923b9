"""A bundle as a consumer meets it, with their own tools only: securesystemslib (DSSE), in-toto-attestation
(Statement), Hugging Face `datasets`, pyarrow, polars, duckdb, and dp-accounting to recompute the stated
epsilon from the signed ledger history (issues 15 and 17). The recipes are run exactly as the card shows them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from accounting import ledger
from accounting.events import DpSgd, GaussianQuery
from release import dsse
from release.bundle import GRID_FILE, decode_png, write_bundle
from release.card import dataset_card, split_front_matter
from release.card_history import ledger_history
from release.data import register_from_source
from release.verify import verify_bundle

PRIVRELEASE_PACKAGES = {"release", "accounting", "synth", "audit", "dashboard"}


def _charge(store, run_id: str, events, *, refund: bool = False) -> None:
    ledger.reserve(store, "digits", events, run_id, description=run_id, actor="alice")
    if refund:
        ledger.refund(store, run_id, reason="failed before reading data", actor="alice")
    else:
        ledger.commit(store, run_id, events, actor="alice")


@pytest.fixture(scope="module")
def consumer_dir(tmp_path_factory):
    """Three DP releases' charges (and one refunded run) on one dataset; the third release's bundle,
    published with its whole history, copied with only the public key into a consumer's directory."""
    from accounting.store import Store, Workspace

    base = tmp_path_factory.mktemp("c")
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (40, 8, 8), dtype=np.uint8)
    labels = np.arange(40) % 10
    np.savez(base / "digits.npz", images=images, labels=labels)
    ws = Workspace(base / "ws")
    ws.init()
    store = Store(ws)
    register_from_source(
        store, "digits", str(base / "digits.npz"), epsilon_cap=20.0, delta_cap=1e-5, labels="0-9"
    )
    # noise multipliers of 3-5: the PLD of each DP-SGD run (composed here, in the card's recipe
    # and in docs/bundles.md's consumer path) takes a fifth of the time it takes at about 1
    _charge(store, "rel-1", [GaussianQuery(sigma=8.0), DpSgd(0.05, 4.0, 40)])
    _charge(store, "rel-x", [DpSgd(0.05, 0.9, 30)], refund=True)
    _charge(
        store, "rel-2", [GaussianQuery(sigma=8.0), DpSgd(0.05, 5.0, 25)]
    )  # same query as rel-1: grouped
    _charge(store, "rel-3", [GaussianQuery(sigma=8.0, sensitivity=2**0.5), DpSgd(0.1, 3.0, 20)])
    ds = ledger.get_dataset(store, "digits")
    history = ledger_history(store, ds.dataset_id)
    spent = ledger.budget(store, "digits").spent
    rel = {
        "release_id": "rel-3",
        "spec": {
            "release": {"dataset": "digits", "mechanism": "privimage", "license": "cc-by-4.0"},
            "privimage": {"preset": "tiny", "public": "builtin:uci-digits"},
        },
    }
    result = {
        "mechanism": "privimage",
        "guarantee": {"type": "dp", **spent.as_dict()},
        "parameters": {
            "selected_public_classes": [3, 5],
            "steps": 20,
            "public_pretraining": "shipped checkpoint demo-pretrain.pt (sha256 ab12), trained on "
            "public digits: public data only, no sensitive record, no privacy cost",
        },
    }
    out_images = rng.integers(0, 256, (30, 8, 8), dtype=np.uint8)
    out_labels = np.arange(30) % 10
    card = dataset_card(rel, asdict(ds), result, 30, {"utility": "pass"}, history=history)
    info = write_bundle(
        ws.bundles / "rel-3",
        images=out_images,
        labels=out_labels,
        ids=[f"rel-3-{i:06d}" for i in range(30)],
        card_markdown=card,
        predicate={
            "release_id": "rel-3",
            "dataset_id": ds.dataset_id,
            "history": history,
            "guarantee": result["guarantee"],
        },
        workspace=ws,
        rows_per_file=20,
    )
    consumer = base / "consumer"
    consumer.mkdir()
    shutil.copytree(info.path, consumer / "rel-3")
    shutil.copy(info.tarball, consumer / "rel-3.tar.gz")
    shutil.copy(info.public_key_path, consumer / "release.pub")
    return {
        "dir": consumer,
        "images": out_images,
        "labels": out_labels,
        "spent": spent,
        "history": history,
        "info": info,
    }


def _card(consumer: Path) -> str:
    return (consumer / "rel-3" / "README.md").read_text()


def _code_block(card: str, heading: str) -> str:
    section = card.split(f"## {heading}", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_recipe(code: str, cwd: Path) -> str:
    """Run a card's recipe in a fresh interpreter, and prove it did not use privrelease."""
    guard = (
        "\nimport sys\nused = sorted({m.split('.')[0] for m in sys.modules} & %r)\n"
        "assert not used, used\n" % PRIVRELEASE_PACKAGES
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [sys.executable, "-c", code + guard], cwd=cwd, capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_securesystemslib_recipe_from_the_card_verifies_the_bundle(consumer_dir):
    consumer = consumer_dir["dir"]
    card = _card(consumer)
    keyid = dsse.sslib_keyid(consumer / "release.pub")
    assert f"keyid (securesystemslib default): `{keyid}`" in card
    _run_recipe(_code_block(card, "Verify"), consumer)
    # The same recipe fails on a tampered file.
    tampered = consumer.parent / "tampered"
    shutil.copytree(consumer, tampered)
    (tampered / "rel-3" / GRID_FILE).write_bytes(b"not the grid")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [sys.executable, "-c", _code_block(card, "Verify")],
        cwd=tampered,
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode != 0 and "sample_grid.png" in p.stderr


def test_securesystemslib_and_in_toto_attestation_accept_the_envelope(consumer_dir):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    root = consumer_dir["dir"] / "rel-3"
    key = SSlibKey.from_crypto(
        load_pem_public_key((consumer_dir["dir"] / "release.pub").read_bytes())
    )
    envelope = Envelope.from_dict(json.loads((root / "manifest.dsse.json").read_bytes()))
    assert set(envelope.verify([key], 1)) == {
        key.keyid
    }  # found by its default keyid, no configuration
    assert envelope.payload == (root / "manifest.intoto.json").read_bytes()
    statement = Statement.copy_from_pb(
        json_format.Parse(envelope.payload, statement_pb2.Statement())
    )
    statement.validate()
    names = {s.name for s in statement.pb.subject}
    assert {
        "README.md",
        GRID_FILE,
        "croissant.json",
        "data/part-00000.parquet",
        "data/part-00001.parquet",
    } == names


def test_datasets_load_dataset_returns_decoded_images_with_named_labels(
    consumer_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    ds = datasets.load_dataset(
        str(consumer_dir["dir"] / "rel-3"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert len(ds) == 30
    assert isinstance(ds.features["image"], datasets.Image)
    assert isinstance(ds.features["label"], datasets.ClassLabel)
    assert ds.features["label"].names == [
        str(i) for i in range(10)
    ]  # the dataset's declared labels
    first = ds[0]
    assert np.array_equal(np.asarray(first["image"]), consumer_dir["images"][0])
    assert [r["label"] for r in ds] == consumer_dir["labels"].tolist()


def test_parquet_is_read_by_pyarrow_polars_and_duckdb_without_custom_code(consumer_dir):
    import duckdb
    import polars as pl

    data = consumer_dir["dir"] / "rel-3" / "data"
    meta = pq.ParquetFile(data / "part-00000.parquet").metadata
    assert meta.num_rows == 20 and meta.num_row_groups >= 1
    table = pq.read_table(data)
    assert decode_png(table.column("image")[0]["bytes"].as_py()).shape == (8, 8)
    frame = pl.read_parquet(str(data / "*.parquet"))
    assert (
        frame.height == 30 and frame["image"].struct.field("bytes")[0][:8] == b"\x89PNG\r\n\x1a\n"
    )
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT image.bytes, label, id FROM read_parquet('{data}/*.parquet') ORDER BY id"
    ).fetchall()
    assert len(rows) == 30 and rows[0][2] == "rel-3-000000" and rows[0][0][:4] == b"\x89PNG"


def test_croissant_metadata_validates_and_reads_the_records_offline(consumer_dir):
    import hashlib

    import mlcroissant as mlc

    root = consumer_dir["dir"] / "rel-3"
    doc = json.loads((root / "croissant.json").read_text())
    for key in (
        "rai:dataCollection",
        "rai:dataLimitations",
        "rai:dataBiases",
        "rai:personalSensitiveInformation",
        "rai:dataUseCases",
    ):
        assert doc.get(key), key
    assert "differential privacy" in doc["rai:personalSensitiveInformation"]
    files = {
        d["contentUrl"]: d["sha256"] for d in doc["distribution"] if d["@type"] == "cr:FileObject"
    }
    assert files == {
        n: hashlib.sha256((root / n).read_bytes()).hexdigest()
        for n in ("data/part-00000.parquet", "data/part-00001.parquet")
    }
    dataset = mlc.Dataset(jsonld=str(root / "croissant.json"))  # raises on validation errors
    assert not dataset.metadata.issues.errors
    records = list(dataset.records("default"))
    assert len(records) == 30
    assert np.array_equal(np.asarray(records[0]["default/image"]), consumer_dir["images"][0])
    assert sorted(r["default/label"] for r in records) == sorted(consumer_dir["labels"].tolist())


def test_sample_grid_is_signed_and_shows_each_class(consumer_dir):
    root = consumer_dir["dir"] / "rel-3"
    result = verify_bundle(root, consumer_dir["dir"] / "release.pub")
    assert result.ok and GRID_FILE in result.checked
    grid = decode_png((root / GRID_FILE).read_bytes())
    assert grid.shape == (10 * 10, 8 * 10)  # one row per class, up to 8 images, 2-pixel gaps
    assert np.array_equal(grid[1:9, 1:9], consumer_dir["images"][0])


def test_card_front_matter_and_sections(consumer_dir):
    meta, body = split_front_matter(_card(consumer_dir["dir"]))
    assert meta["license"] == "cc-by-4.0" and meta["task_categories"] == ["image-classification"]
    assert meta["size_categories"] == ["n<1K"]
    assert meta["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/*.parquet"}]}
    ]
    assert meta["dataset_info"]["splits"][0]["num_examples"] == 30
    assert [f["name"] for f in meta["dataset_info"]["features"]] == ["image", "label", "id"]
    for heading in (
        "Privacy guarantee",
        "How it was made",
        "Limitations",
        "Intended use",
        "Version",
        "License",
        "Citation",
        "Files and loading",
        "Verify",
        "Recompute the privacy loss yourself",
    ):
        assert f"## {heading}" in body, heading
    assert "- Preset: tiny" in body and "builtin:uci-digits" in body and "[3, 5]" in body
    # where the pre-trained model came from, said once in words above the parameter list
    assert "- Public pre-training: shipped checkpoint demo-pretrain.pt (sha256 ab12)" in body
    assert "@misc{rel_3," in body
    # the guarantee under adaptive choice: the ledger's filter and its cap, not only the composed figures
    assert "privacy filter with cap epsilon = 20, delta = 1e-05" in " ".join(body.split())


def test_default_license_when_the_spec_names_none():
    rel = {
        "release_id": "r",
        "spec": {"release": {"dataset": "d", "mechanism": "ksalsa"}, "ksalsa": {}},
    }
    result = {
        "mechanism": "ksalsa",
        "guarantee": {"type": "k-anonymity", "k": 5},
        "parameters": {"method": "pca"},
    }
    meta, body = split_front_matter(
        dataset_card(
            rel, {"dataset_id": "d", "privacy_unit": "one image", "labels": [0, 1]}, result, 4, {}
        )
    )
    assert meta["license"] == "other" and "set no license" in body
    assert yaml.safe_load(yaml.safe_dump(meta)) == meta


def test_dp_accounting_recipe_recomputes_the_stated_epsilon(consumer_dir):
    """Issue 15: the whole history is in the signed predicate; dp-accounting alone gives the card's numbers."""
    consumer = consumer_dir["dir"]
    statement = verify_bundle(consumer / "rel-3.tar.gz", consumer / "release.pub")
    assert statement.ok, statement.problems
    history = statement.predicate["history"]
    assert [(e["run_id"], e["state"]) for e in history["entries"]] == [
        ("rel-1", "committed"),
        ("rel-x", "refunded"),
        ("rel-2", "committed"),
        ("rel-3", "committed"),
    ]
    positions = [e["position"] for e in history["entries"]]
    assert positions == sorted(positions) and history["entries"][1]["events"] == []
    out = _run_recipe(_code_block(_card(consumer), "Recompute the privacy loss yourself"), consumer)
    rdp, pld = map(float, re.search(r"epsilon RDP (\S+) PLD (\S+)", out).groups())
    assert rdp == pytest.approx(history["epsilon_rdp"], rel=1e-12)
    assert pld == pytest.approx(history["epsilon_pld"], rel=1e-12)
    # ... and they are the ledger's own figures (the ledger groups identical events; same loss).
    spent = consumer_dir["spent"]
    assert rdp == pytest.approx(spent.epsilon_rdp, rel=1e-9)
    assert pld == pytest.approx(spent.epsilon_pld, rel=1e-3)
    assert f"**{rdp:.3f}**" in _card(consumer) and f"**{pld:.3f}**" in _card(consumer)


def test_spec_license_reaches_the_card_and_bad_ids_are_refused():
    from accounting.errors import InvalidParameterError
    from release.spec import ReleaseSpec

    spec = ReleaseSpec.from_dict(
        {"release": {"dataset": "d", "mechanism": "ksalsa", "license": "cc0-1.0"}}
    )
    rel = {"release_id": "r", "spec": spec.as_dict()}
    result = {"mechanism": "ksalsa", "guarantee": {"type": "k-anonymity", "k": 5}, "parameters": {}}
    meta, _ = split_front_matter(
        dataset_card(rel, {"dataset_id": "d", "privacy_unit": "one image"}, result, 4, {})
    )
    assert meta["license"] == "cc0-1.0"
    for bad in ("CC BY 4.0", "", 3, "a" * 80):
        with pytest.raises(InvalidParameterError, match="license identifier"):
            ReleaseSpec.from_dict(
                {"release": {"dataset": "d", "mechanism": "ksalsa", "license": bad}}
            )


def test_readme_consumer_path_verify_load_train(consumer_dir, tmp_path):
    """docs/bundles.md's three-line consumer path, run as written (REL = this bundle) on a fresh copy of the
    tarball."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "bundles.md").read_text()
    script = re.search(r"```bash\n(.*?)```", page, re.S).group(1).replace("REL", "rel-3")
    work = tmp_path / "download"
    work.mkdir()
    shutil.copy(consumer_dir["dir"] / "rel-3.tar.gz", work)
    shutil.copy(consumer_dir["dir"] / "release.pub", work)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    p = subprocess.run(
        ["bash", "-e", "-c", script], cwd=work, capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK: signature valid" in p.stdout and "LogisticRegression" in p.stdout
    assert (work / "rel-3" / "README.md").is_file()


def test_long_histories_recompute_in_one_call_per_distinct_event():
    """10,000 events of 3 kinds: grouped like the ledger groups them, so publishing stays fast."""
    import time

    from accounting.epsilon import epsilon_report
    from accounting.events import event_to_json
    from release.card_history import recompute_epsilon

    kinds = [GaussianQuery(sigma=50.0), DpSgd(0.01, 2.0, 10), DpSgd(0.02, 3.0, 5)]
    events = [kinds[i % 3] for i in range(10_000)]
    history = {
        "delta": 1e-5,
        "rdp_orders": [1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        "pld_value_discretization_interval": 1e-3,
        "entries": [
            {"position": i, "run_id": f"r{i}", "state": "committed", "events": [event_to_json(e)]}
            for i, e in enumerate(events)
        ],
    }
    start = time.perf_counter()
    got = recompute_epsilon(history)
    assert time.perf_counter() - start < 30
    ref = epsilon_report(events, 1e-5)
    assert got["epsilon_rdp"] >= ref.epsilon_rdp * (
        1 - 1e-9
    )  # coarser orders: never below the fine grid
    assert got["epsilon_rdp"] == pytest.approx(ref.epsilon_rdp, rel=0.2)


@pytest.mark.parametrize("vote,rounds", [(None, None), (2.0, 1), (2.0, 3)])
def test_card_says_what_the_private_vote_chose_only_when_it_ran(vote, rounds):
    rel = {
        "release_id": "r",
        "spec": {"release": {"dataset": "d", "mechanism": "privimage"}, "privimage": {}},
    }
    params = {"vote_sigma": vote, "vote_pool": 4 if vote else None, "vote_rounds": rounds}
    result = {
        "mechanism": "privimage",
        "parameters": params,
        "guarantee": {"type": "dp", "epsilon_rdp": 8.0, "epsilon_pld": 7.1, "delta": 1e-5},
    }
    _, body = split_front_matter(
        dataset_card(rel, {"dataset_id": "d", "privacy_unit": "one image"}, result, 4, {})
    )
    assert ("chosen from 4 generated candidates by a differentially private vote" in body) == bool(
        vote
    )
    assert ("the choice of candidates (DP Gaussian vote)" in body) == bool(vote)
    assert ("The vote ran 3 rounds" in body) == (rounds == 3)


@pytest.mark.parametrize("copies", [0, 1, 3])
def test_card_warns_that_release_variations_are_near_duplicates(copies):
    rel = {
        "release_id": "r",
        "spec": {"release": {"dataset": "d", "mechanism": "privimage"}, "privimage": {}},
    }
    params = {
        "vote_sigma": 2.0,
        "vote_pool": 4,
        "vote_rounds": 4,
        "release_variations": copies,
        "release_variation_strength": 0.15 if copies else None,
    }
    result = {
        "mechanism": "privimage",
        "parameters": params,
        "guarantee": {"type": "dp", "epsilon_rdp": 8.0, "epsilon_pld": 7.1, "delta": 1e-5},
    }
    _, body = split_front_matter(
        dataset_card(rel, {"dataset_id": "d", "privacy_unit": "one image"}, result, 8, {})
    )
    assert (f"groups of {copies + 1} images are near-duplicates" in body) == bool(copies)
    assert ("Each voted image was then chosen from 4 generated candidates" in body) == bool(copies)


@pytest.mark.parametrize("space", [None, "pixel", "embedding"])
def test_card_says_where_the_vote_measured_nearness(space):
    rel = {
        "release_id": "r",
        "spec": {"release": {"dataset": "d", "mechanism": "privimage"}, "privimage": {}},
    }
    # the pixel case also splits each vote over the 4 nearest (the demo preset); the others vote once
    params = {
        "vote_sigma": 2.0,
        "vote_pool": 4,
        "vote_rounds": 1,
        "vote_space": space,
        "vote_neighbours": 4 if space == "pixel" else None,
    }
    result = {
        "mechanism": "privimage",
        "parameters": params,
        "guarantee": {"type": "dp", "epsilon_rdp": 8.0, "epsilon_pld": 7.1, "delta": 1e-5},
    }
    _, body = split_front_matter(
        dataset_card(rel, {"dataset_id": "d", "privacy_unit": "one image"}, result, 4, {})
    )
    assert ("features of a public ImageNet-pretrained EfficientNet-Lite0" in body) == (
        space == "embedding"
    )
    assert "count of nearest sensitive images" in body
    assert ("split its vote over its 4 nearest candidates" in body) == (space == "pixel")
