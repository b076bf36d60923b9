"""The layering of ARCHITECTURE.md, kept by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import os
import re
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


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages' Python files and pyproject.toml, copied once; the copy keeps the contracts (one
    `lint-imports` run, not one per planted violation). Tests plant into their own copy of it."""
    root = tmp_path_factory.mktemp("clean-tree")
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg,
            root / pkg,
            ignore=lambda d, names: [
                n
                for n in names
                if not (n.endswith(".py") or (Path(d) / n).is_dir()) or n == "__pycache__"
            ],
        )
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    p = lint_imports(root)
    assert p.returncode == 0, p.stdout[-3000:]  # the copy keeps the contracts before any plant
    return root


@pytest.fixture
def tree_copy(clean_tree: Path, tmp_path: Path) -> Path:
    """A copy of the clean tree where a planted import or name cannot hurt."""
    shutil.copytree(clean_tree, tmp_path / "tree")
    return tmp_path / "tree"


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
    target = tree_copy / module
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    p = lint_imports(tree_copy)
    assert p.returncode != 0, p.stdout[-3000:]
    broken = p.stdout.split("Broken contracts")[-1]
    assert contract in broken, broken[-3000:]


# ------------------------------------------------------------------ one place per output kind
# release/ and the audit's core reach mechanisms through synth.registry and output kinds through
# release.kinds / audit.kinds, never by name: neither names a mechanism nor a built-in kind.
NAMED_MECHANISM = r"privimage|merf|k-?salsa|face[-_ ]deid|deface|reface"
# kind words, as words or word starts ("interface", "surface", "Hugging Face" are not faces)
NAMED_KIND = r"(?<![a-z])(?:volume|photo|mri(?![a-z])|nifti|(?<!hugging )face)"
NAMES_PATTERN = re.compile(f"{NAMED_MECHANISM}|{NAMED_KIND}", re.IGNORECASE)
NAME_FREE = ("release/*.py", "release/kinds/*.py", "audit/kinds/*.py") + tuple(
    f"audit/{m}.py" for m in ("run", "policy", "report", "checks", "inputs")
)
# modules that may name them, and why:
NAMING_ALLOWED = {
    # the places that register the built-in kinds (their storage, bundle and card; their checks)
    "release/kinds/builtin.py",
    "audit/kinds/builtin.py",
    # the demo walks through the built-in mechanisms by name (per-mechanism CLI commands live
    # in release/cli/, not matched above)
    "release/demo.py",
}


def naming_hits(root: Path) -> list[str]:
    """`path:line: text` of every mention of a mechanism or built-in kind in the name-free
    modules under `root`, the allowed ones left out."""
    hits = []
    for pattern in NAME_FREE:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if rel in NAMING_ALLOWED:
                continue
            for n, text in enumerate(path.read_text().splitlines(), 1):
                if NAMES_PATTERN.search(text):
                    hits.append(f"{rel}:{n}: {text.strip()}")
    return hits


def test_release_and_the_audit_core_name_no_mechanism_and_no_output_kind():
    hits = naming_hits(ROOT)
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize(
    "module, line",
    [
        ("release/publish.py", "# a volume release's files"),
        ("release/artifacts.py", "from synth.mechanisms.privimage import pipeline"),
        ("release/kinds/__init__.py", 'DEFAULT = "photographs"'),
        ("audit/run.py", "from audit.face_reid import face_attacks"),
        ("audit/report.py", "# see the MRI audit"),
        ("audit/checks.py", 'MECHANISM = "k-SALSA"'),
        ("release/planning.py", '"face-deid"'),
    ],
)
def test_a_planted_name_is_found(tree_copy: Path, module: str, line: str):
    assert naming_hits(tree_copy) == []  # the copy is name-free before the plant
    target = tree_copy / module
    target.write_text(target.read_text() + f"\n{line}\n")
    (hit,) = naming_hits(tree_copy)
    assert hit.startswith(f"{module}:") and hit.endswith(line)
