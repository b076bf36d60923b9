"""`audit run REL --workers N | --cluster ADDR` (issue 56): the audit's per-item work on Dask
workers, through the command line. A face-deid release (tiny preset, real photos) run and audited
in this process, then audited again on two local worker processes: every check comes out the same,
number for number (slow: the workers import torch and load the recognisers)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from accounting.errors import InvalidParameterError
from accounting.store import Store, Workspace
from release.cli import app

runner = CliRunner()


def cli(ws, *args):
    return runner.invoke(app, ["--workspace", str(ws), *args], catch_exceptions=True)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    assert cli(root, "init", "--steward", "alice").exit_code == 0
    return root


def test_audit_run_refuses_workers_and_a_cluster_together(ws) -> None:
    r = cli(ws, "audit", "run", "REL-1", "--workers", "2", "--cluster", "tcp://h:8786", "--as",
            "alice")  # fmt: skip
    assert isinstance(r.exception, InvalidParameterError)  # the command line prints its message
    assert "--workers starts a cluster on this machine and --cluster uses a site's" in str(
        r.exception
    )


def test_audit_run_help_names_the_options(ws) -> None:
    r = cli(ws, "audit", "run", "--help")
    assert r.exit_code == 0 and "--workers" in r.output and "--cluster" in r.output


@pytest.mark.slow
def test_an_audit_on_two_workers_equals_the_one_in_this_process(ws, tmp_path) -> None:
    from audit import load_report
    from tests.support import face_photos

    folder = face_photos.write_folder(tmp_path / "photos")
    r = cli(ws, "dataset", "register", "faces", "--source", f"photos-192:{folder}", "--epsilon",
            "10", "--delta", "1e-5", "--as", "alice")  # fmt: skip
    assert r.exit_code == 0, r.output
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[release]\ndataset = "faces"\nmechanism = "face-deid"\n[face-deid]\npreset = "tiny"\n'
        "[policy]\nmin_utility_gain = 0.0\nface_max_landmark_shift = 0.15\n"
    )
    r = cli(ws, "release", "plan", str(spec), "--json", "--as", "alice")
    assert r.exit_code == 0, r.output
    rel = json.loads(r.stdout)["release_id"]  # progress lines go to stderr
    assert (
        cli(ws, "release", "approve", rel, "--acknowledge-non-dp", "--as", "alice").exit_code == 0
    )
    ran = cli(ws, "release", "run", rel, "--as", "alice")
    assert ran.exit_code == 0, ran.output
    store = Store(Workspace(ws))
    here = load_report(store, rel)
    audited = cli(ws, "audit", "run", rel, "--workers", "2", "--as", "alice")
    assert audited.exit_code == 0, audited.output
    assert "Audit items run on 2 local Dask worker process(es)." in audited.output
    there = load_report(store, rel)
    assert here is not None and there is not None
    faces = [r for r in here.results if r.name.startswith("face_")]
    assert len(faces) >= 4  # three recognisers' attacks and the realism checks
    assert [r.name for r in here.results] == [r.name for r in there.results]
    for a, b in zip(here.results, there.results, strict=True):
        if a.name.startswith("face_"):  # the checks whose items ran on the workers
            assert (a.passed, a.summary, a.details) == (b.passed, b.summary, b.details), a.name
        else:
            assert a.passed == b.passed, a.name
