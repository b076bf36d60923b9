"""A held-out attacker by construction (issue 54): a face-deid plan whose search covers every
recogniser the audit attacks with is refused before anything is stored, unless acknowledged; the
default plan holds FaceNet out."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from accounting.errors import InvalidParameterError
from audit.held_out import check_held_out, held_out_recognisers
from release.cli import app

runner = CliRunner()


def test_held_out_is_what_the_audit_has_and_the_search_had_not() -> None:
    detail = {"searched_recognisers": ["dlib", "sface"]}
    assert held_out_recognisers(detail, ("dlib", "sface", "facenet")) == ["facenet"]
    assert held_out_recognisers(detail, ("dlib", "sface")) == []
    assert held_out_recognisers({}, ("dlib",)) is None  # a mechanism that searched nothing
    check_held_out("face-deid", detail, ("dlib", "sface", "facenet"))
    check_held_out("privimage", {}, ("dlib",))
    with pytest.raises(InvalidParameterError, match="could not\\s+fail it"):
        check_held_out("face-deid", detail, ("sface", "dlib"))
    check_held_out("face-deid", {**detail, "no_held_out_acknowledged": True}, ("dlib", "sface"))


def _cli(ws, *args):
    return runner.invoke(app, ["--workspace", str(ws), *args], catch_exceptions=True)


@pytest.fixture
def ws(tmp_path):
    from tests.support import face_photos

    folder = face_photos.write_folder(tmp_path / "photos")
    root = tmp_path / "ws"
    assert _cli(root, "init", "--steward", "alice").exit_code == 0
    r = _cli(
        root,
        "dataset",
        "register",
        "faces",
        "--source",
        f"photos-128:{folder}",
        "--epsilon",
        "10",
        "--delta",
        "1e-5",
        "--as",
        "alice",
    )
    assert r.exit_code == 0, r.output
    return root


def _spec(tmp_path, deid: str, policy: str = "") -> str:
    path = tmp_path / "spec.toml"
    path.write_text(
        '[release]\ndataset = "faces"\nmechanism = "face-deid"\n'
        f'[face-deid]\npreset = "tiny"\n{deid}\n[policy]\nmin_utility_gain = 0.0\n{policy}\n'
    )
    return str(path)


def _releases(ws) -> list:
    return json.loads(_cli(ws, "release", "list", "--json").output)


def test_a_search_over_every_audit_recogniser_is_refused_before_storing(ws, tmp_path) -> None:
    spec = _spec(tmp_path, 'recognisers = ["dlib", "sface", "facenet"]')
    r = _cli(ws, "release", "plan", spec, "--as", "alice")
    assert isinstance(r.exception, InvalidParameterError)
    assert "every recogniser the audit attacks with" in str(r.exception)
    assert "acknowledge_no_held_out" in str(r.exception)
    assert _releases(ws) == []
    # the same search against a policy that adds nothing beyond it: still refused
    spec = _spec(tmp_path, "", 'face_recognisers = ["sface", "facenet"]')
    r = _cli(ws, "release", "plan", spec, "--as", "alice")
    assert isinstance(r.exception, InvalidParameterError)
    assert _releases(ws) == []


def test_acknowledged_or_held_out_plans_are_stored(ws, tmp_path) -> None:
    ack = _spec(
        tmp_path, 'recognisers = ["dlib", "sface", "facenet"]\nacknowledge_no_held_out = true'
    )
    r = _cli(ws, "release", "plan", ack, "--as", "alice")
    assert r.exit_code == 0, r.output
    default = _spec(tmp_path, "")
    r = _cli(ws, "release", "plan", default, "--as", "alice")
    assert r.exit_code == 0, r.output
    assert len(_releases(ws)) == 2
