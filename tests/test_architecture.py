"""The layering of ARCHITECTURE.md, kept by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("accounting", "synth", "audit", "release", "dashboard", "benchmarks")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tree at root, with that tree's packages first on the path."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", script, str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_code_keeps_the_architecture_contracts():
    p = lint_imports(ROOT)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The packages' Python files and pyproject.toml, copied where a planted import cannot hurt."""
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg,
            tmp_path / pkg,
            ignore=lambda d, names: [
                n
                for n in names
                if not (n.endswith(".py") or (Path(d) / n).is_dir()) or n == "__pycache__"
            ],
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(
    "module, line, contract",
    [
        (
            "dashboard/planted.py",
            "from accounting import ledger",
            "The dashboard imports release only",
        ),
        ("accounting/planted.py", "import torch", "accounting imports no torch"),
        (  # privimage's frequency warm-up uses the kernel tool, never the merf mechanism
            "synth/mechanisms/privimage/planted.py",
            "from synth.mechanisms.merf import config",
            "A mechanism never imports another mechanism",
        ),
        (
            "synth/tools/planted.py",
            "from synth.mechanisms.face_deid import anonymise",
            "synth's rooms depend one way",
        ),
        (
            "synth/kinds/planted.py",
            "from synth.tools import face_models",
            "synth's rooms depend one way",
        ),
        ("synth/planted.py", "from accounting import ledger", "Mechanisms never touch the store"),
        (
            "audit/planted.py",
            "from synth.mechanisms.privimage import training",
            "audit reaches a mechanism through",
        ),
        (  # the face attack uses synth.tools.face_models, never the face-deid mechanism
            "audit/planted.py",
            "from synth.mechanisms.face_deid import anonymise",
            "audit reaches a mechanism through",
        ),
        ("accounting/planted.py", "from release import manager", "Packages depend one way"),
        (
            "release/planted.py",
            "from release.cli import common",
            "Only the entry point imports release.cli",
        ),
        (
            "synth/kinds/image_dataset.py",
            "from synth.kinds import datasets",
            "No import cycles",
        ),  # datasets imports it
    ],
)
def test_a_planted_violation_breaks_its_contract(
    tree_copy: Path, module: str, line: str, contract: str
):
    assert lint_imports(tree_copy).returncode == 0  # the copy keeps the contracts before the plant
    target = tree_copy / module
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    p = lint_imports(tree_copy)
    assert p.returncode != 0, p.stdout[-3000:]
    broken = p.stdout.split("Broken contracts")[-1]
    assert contract in broken, broken[-3000:]
