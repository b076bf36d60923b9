"""Head MRI as neuroimaging stewards hold it, end to end through the command line: a BIDS dataset
(8 subjects x 2 sessions, T1w and T2w, sidecars full of names and dates) registered, defaced and
refaced, audited (the BIDS validator among the checks), published, verified offline and opened
as a BIDS dataset; a DICOM study (6 patients, pydicom-written) converted by dcm2niix on the way
in. Every released byte is searched for the inputs' names, dates, UIDs, institution and serial
(SYNTHETIC heads made from Colin27 and pydeface's template)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from audit.bids_validation import validator
from synth.kinds.nifti import header_text, read_volume
from tests.support.bids_heads import PHI, bids_dataset, dicom_study, leaked
from tests.support.cli import in_process, init_and_register, planned
from tests.support.heads import needs_templates

needs_validator = pytest.mark.skipif(
    validator() is None,
    reason="the BIDS validator is not installed (make bids-validator)",
)
needs_dcm2niix = pytest.mark.skipif(
    shutil.which("dcm2niix") is None, reason="dcm2niix (Debian package dcm2niix) is not installed"
)
pytestmark = [needs_templates, needs_validator, pytest.mark.slow]


def _release(tmp_path: Path, monkeypatch, source: str, mechanism: str) -> tuple[Path, str]:
    """Register `source`, release it with `mechanism`, publish, verify; the extracted bundle."""
    run = in_process(monkeypatch, tmp_path / "ws", tmp_path.parent / "head-atlas-cache")
    init_and_register(run, "heads", source)
    shown = json.loads(run("dataset", "list", "--json"))
    assert shown[0]["privacy_unit"].startswith("one subject")
    # 6 mm test heads: the face check loosened as in test_volumes_e2e; quickshear's plane at 6 mm
    # leaves most of the face (the audit fails it), pydeface's mask does not
    method = 'method = "mask"\n' if mechanism == "deface" else ""
    toml = (
        f'[release]\ndataset = "heads"\nmechanism = "{mechanism}"\n[{mechanism}]\n{method}'
        "[policy]\nvolume_max_face_correlation = 0.7\n"
    )
    rid = planned(run, tmp_path / "spec.toml", toml, "--acknowledge-non-dp")
    run("release", "run", rid, "--as", "alice")
    run("release", "publish", rid, "--as", "alice")
    out = tmp_path / "consumer"
    run(
        "verify",
        str(tmp_path / "ws" / "bundles" / f"{rid}.tar.gz"),
        "--key",
        str(tmp_path / "ws" / "keys" / "release.pub"),
        "--extract",
        str(out),
    )
    return out / rid, rid


def _check_bids_bundle(bundle: Path, source_tree: Path, n_images: int, tmp_path: Path) -> None:
    import ancpbids

    tree = bundle / "data" / "bids"
    desc = json.loads((tree / "dataset_description.json").read_text())
    assert desc["DatasetType"] == "derivative" and desc["GeneratedBy"][0]["Name"] == "privrelease"
    report = json.loads((bundle / "data" / "bids_validator.json").read_text())
    assert report["errors"] == [], report["errors"]
    images = ancpbids.load_dataset(str(tree)).query(
        suffix=["T1w", "T2w"], extension=[".nii", ".nii.gz"]
    )
    assert len(images) == n_images
    for image in images:  # same paths; brain bit-identical is the audit's; headers stripped
        rel = image.get_relative_path()
        released = read_volume(tree / rel)
        original = read_volume(source_tree / rel)
        assert released.shape == original.shape and np.allclose(released.affine, original.affine)
        assert header_text(tree / rel) == {}
        sidecar = json.loads((tree / rel.replace(".nii.gz", ".json")).read_text())
        assert set(sidecar) <= {
            "RepetitionTime",
            "EchoTime",
            "FlipAngle",
            "MagneticFieldStrength",
            "Manufacturer",
            "ManufacturersModelName",
            "SliceThickness",
        }
    assert (tree / "participants.tsv").read_text().splitlines()[0] == "participant_id"
    import pyarrow.parquet as pq  # the consumer's other view: one row per image, naming its file

    rows = pq.read_table(sorted((bundle / "data").glob("*.parquet"))).column("file").to_pylist()
    assert len(rows) == n_images and all((bundle / f).is_file() for f in rows)
    assert {f.removeprefix("data/bids/") for f in rows} == {i.get_relative_path() for i in images}
    card = (bundle / "README.md").read_text() if (bundle / "README.md").exists() else ""
    assert not leaked(bundle), leaked(bundle)
    assert not leaked(tmp_path / "ws" / "bundles")  # the tarball as shipped, unpacked
    if card:
        assert "sidecars kept" in card


@pytest.mark.parametrize("mechanism", ["deface", "reface"])
def test_bids_dataset_8_subjects_2_sessions_released_valid_and_clean(
    tmp_path, monkeypatch, mechanism
) -> None:
    # reface's face is pydeface's template's: heads made from that template keep it (chance-level
    # re-identification needs heads made from Colin27 only, as in test_volumes_e2e); seed 2's 8
    # Colin27 heads all pass admission at 6 mm (seeds 0 and 1 each hold a head whose quickshear
    # plane cuts nothing on that coarse grid, refused at registration)
    reface = mechanism == "reface"
    src = bids_dataset(tmp_path / "ds", 8, 2, colin_only=reface, seed=2 if reface else 0)
    bundle, rid = _release(tmp_path, monkeypatch, f"bids:{src}", mechanism)
    _check_bids_bundle(bundle, src, 32, tmp_path)


@needs_dcm2niix
def test_dicom_study_6_subjects_converted_released_valid_and_clean(tmp_path, monkeypatch) -> None:
    # Colin27-made heads: at 6 mm the audit's registration of Colin27 to a head made from
    # pydeface's template, in the grid dcm2niix writes (rows flipped), fits worse (metric -0.67
    # instead of -0.81) and finds a brain a fifth too large, failing the release on a few brain
    # voxels the mechanism's margin did not cover; Colin27-made heads fit at -1.1 in any grid
    study = dicom_study(tmp_path / "study", 6, seed=2, colin_only=True)
    bundle, rid = _release(tmp_path, monkeypatch, f"dicom:{study}", "deface")
    tree = bundle / "data" / "bids"
    assert sorted(p.name for p in tree.glob("sub-*")) == [f"sub-{i:02d}" for i in range(1, 7)]
    report = json.loads((bundle / "data" / "bids_validator.json").read_text())
    assert report["errors"] == [], report["errors"]
    assert not leaked(bundle), leaked(bundle)
    assert not list(bundle.rglob("*.dcm"))
    assert (
        all(v not in (bundle / "README.md").read_text() for v in PHI)
        if (bundle / "README.md").exists()
        else True
    )
