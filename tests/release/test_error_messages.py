"""User-facing text says what was wrong and what to do by itself: no rule numbers of ARCHITECTURE.md and no
"see README" pointers in error messages, CLI help or printed output (docstrings and comments may cite them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("accounting", "audit", "release", "synth", "dashboard")
# "(rule 2)", "rule 4", "README, Scaling out", "see README 'Registering data'"; README.md (a bundle's card) is a file
FORBIDDEN = re.compile(r"\brules? \d+\b|\bREADME\b(?!\.md)")
# a literal that is only a file's name (a BIDS dataset's README file) points nowhere
FILE_NAMES = {"README"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def user_text_violations(source: str, name: str) -> list[str]:
    """String literals (f-string parts included) outside docstrings that cite a rule number or the README."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if FORBIDDEN.search(node.value) and node.value not in FILE_NAMES:
                found.append(f"{name}:{node.lineno}: {node.value.strip()[:100]!r}")
    return found


def test_no_rule_numbers_or_readme_pointers_in_user_facing_strings():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += user_text_violations(
                path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
            )
    assert not found, "say what to do instead:\n" + "\n".join(found)


def test_the_check_finds_a_planted_pointer():
    planted = (
        'def f():\n    """Docstrings may cite rule 2."""\n    raise ValueError(f"bad {x} (rule 2)")\n'
        'HELP = "see README, Scaling out"\nCARD = "README.md"\nBIDS = "README"\n'
    )
    found = user_text_violations(planted, "planted.py")
    assert sorted(f.split(":")[1] for f in found) == ["3", "4"]


def test_a_policy_that_is_not_a_table_says_how_to_write_one():
    from accounting.errors import InvalidParameterError
    from release.spec import ReleaseSpec

    with pytest.raises(InvalidParameterError) as err:
        ReleaseSpec.from_dict(
            {
                "release": {"dataset": "d", "mechanism": "ksalsa"},
                "ksalsa": {"k": 5},
                "policy": "strict",
            }
        )
    assert str(err.value) == (
        "[policy] must be a table of audit thresholds, e.g. a `[policy]` line followed by "
        "`mia_max_auc = 0.6`; remove it to use the default policy."
    )


def test_an_unreadable_workspace_config_says_what_it_holds_and_how_to_fix_it(tmp_path):
    from accounting.errors import PrivReleaseError
    from accounting.store import Workspace

    ws = Workspace(tmp_path / "ws")
    ws.root.mkdir()
    ws.config_path.write_text("[store\nurl = 1\n")
    with pytest.raises(PrivReleaseError) as err:
        ws.store_url
    assert (
        'It holds the shared store\'s URL: fix its [store] url = "postgresql://..." line, or remove the file to '
        "use the workspace's own store.duckdb." in str(err.value)
    )
