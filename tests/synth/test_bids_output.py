"""A released BIDS tree, fast: what synth.kinds.bids_out writes from a read BIDS source (paths,
scrubbed sidecars, a derivative's dataset_description.json, README, participants.tsv with the
allowed columns only) is valid for the BIDS validator (the audit's `bids_valid` check) and opens
with the BIDS library as a dataset. Tiny random volumes stand in for heads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from audit.bids_validation import bids_check, bids_root, validator
from synth.kinds.bids import load_bids
from synth.kinds.bids_out import INDEX, TREE, read_index, write_tree
from tests.support.bids_heads import leaked
from tests.synth.test_bids_input import _tree

needs_validator = pytest.mark.skipif(
    validator() is None,
    reason="the BIDS validator is not installed (make bids-validator)",
)


def _released(tmp_path, query: str = ""):
    src = _tree(tmp_path / "src", 5, 2)
    data = load_bids(f"bids:{src}{query}")
    layout = replace(data.layout, mechanism="deface")
    out = tmp_path / "REL-000001"
    out.mkdir()
    written = write_tree(out, layout, data.volumes, "REL-000001")
    return out, written, layout


def test_tree_keeps_paths_and_only_allowed_fields(tmp_path) -> None:
    out, written, layout = _released(tmp_path, "?participants=age")
    images, others = read_index(out)
    assert images == [r.path for r in layout.records] and written == images + others
    root = out / TREE
    desc = json.loads((root / "dataset_description.json").read_text())
    assert desc["DatasetType"] == "derivative"
    assert desc["GeneratedBy"][0]["Name"] == "privrelease"
    assert "deface release REL-000001" in desc["GeneratedBy"][0]["Description"]
    sidecar = json.loads((root / "sub-01/ses-1/anat/sub-01_ses-1_T1w.json").read_text())
    assert sidecar == {"EchoTime": 0.003}
    rows = (root / "participants.tsv").read_text().splitlines()
    assert rows[0] == "participant_id\tage" and rows[1] == "sub-01\t41" and len(rows) == 6
    assert not leaked(out, ["Jane Q Roe", "2024-01-17", "09:14:03"])
    assert (out / INDEX).is_file() and bids_root([root / images[0]]) == root


@needs_validator
def test_released_tree_passes_the_validator_and_opens_with_ancpbids(tmp_path) -> None:
    import ancpbids

    out, _, _ = _released(tmp_path)
    images, _ = read_index(out)
    check = bids_check([out / TREE / p for p in images], tmp_path / "audit")
    assert check is not None and check.passed, check.summary
    report = json.loads((tmp_path / "audit" / "bids_validator.json").read_text())
    assert report["errors"] == [] and report["version"] == "1.15.0"
    assert str(tmp_path) not in json.dumps(report)  # no local paths or file system metadata
    found = ancpbids.load_dataset(str(out / TREE)).query(
        suffix=["T1w", "T2w"], extension=[".nii", ".nii.gz"], return_type="filename"
    )
    assert len(found) == 20


@needs_validator
def test_an_invalid_tree_fails_bids_valid_naming_the_problem(tmp_path) -> None:
    out, _, _ = _released(tmp_path)
    images, _ = read_index(out)
    (out / TREE / "sub-02/ses-1/anat/sub-02_ses-1_T1w.json").write_text("{not json")
    check = bids_check([out / TREE / p for p in images], None)
    assert check is not None and check.passed is False
    assert "JSON_INVALID" in check.summary


def test_a_flat_release_has_no_bids_check(tmp_path) -> None:
    (tmp_path / "volumes").mkdir()
    assert bids_check([tmp_path / "volumes" / "REL-1.nii.gz"], None) is None


def test_a_missing_validator_fails_the_check_saying_how_to_install(tmp_path, monkeypatch) -> None:
    out, _, _ = _released(tmp_path)
    images, _ = read_index(out)
    monkeypatch.setenv("PRIVRELEASE_BIDS_VALIDATOR", str(tmp_path / "nowhere"))
    check = bids_check([out / TREE / p for p in images], None)
    assert check is not None and check.passed is False
    assert "make bids-validator" in check.summary


def test_an_index_pointing_outside_the_tree_is_refused(tmp_path) -> None:
    (tmp_path / INDEX).write_text(json.dumps({"images": ["../../etc/x.nii.gz"], "files": []}))
    with pytest.raises(ValueError, match="not a path inside the released tree"):
        read_index(tmp_path)
