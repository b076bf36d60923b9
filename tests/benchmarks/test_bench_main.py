"""`make bench` writes each benchmark's section into its own file, docs/benchmarks/<name>.md: what it
measures is replaced, the rest is kept, and a failing section neither erases its old figures nor passes
silently. BENCHMARKS.md stays the short, hand-kept current results that link to those files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import __main__ as bench

DOC = """# Benchmarks

Preamble text.

## The main job (`make demo`)

Demo figures, measured by hand.

## Secure noise

old secure-noise figures

## k-SALSA (k-anonymous MNIST-5k)

old k-SALSA figures
"""


def test_a_measured_section_replaces_the_one_with_its_title_and_keeps_the_rest() -> None:
    out = bench.splice(DOC, "## k-SALSA (k-anonymous release)\n\nnew k-SALSA figures\n")
    assert "new k-SALSA figures" in out and "old k-SALSA figures" not in out
    assert "Demo figures, measured by hand." in out and "old secure-noise figures" in out
    assert out.startswith("# Benchmarks\n\nPreamble text.\n")
    assert out.count("## ") == 3


def test_a_new_section_is_appended_and_an_empty_file_gets_the_header() -> None:
    out = bench.splice(DOC, "## Semantic query\n\nfigures")
    assert out.index("old k-SALSA figures") < out.index("## Semantic query") and out.endswith(
        "figures\n\n"
    )
    assert bench.splice("", "## Secure noise\n\nx").startswith("# Benchmarks\n")


def test_titles_match_before_the_subtitle_only() -> None:
    assert bench.section_key("## PrivImage (quick settings)") == bench.section_key(
        "## PrivImage (synthetic MNIST-5k)"
    )
    assert bench.section_key("## PrivImage recipe ablation (x)") != bench.section_key(
        "## PrivImage (x)"
    )
    assert bench.section_key(
        "## DP-SGD step cost: what the rows say (hand-written)"
    ) != bench.section_key(
        "## DP-SGD step cost by per-sample-gradient method (`python -m benchmarks.dpsgd_throughput`)"
    )


def test_a_section_without_a_heading_is_refused() -> None:
    with pytest.raises(ValueError, match="heading"):
        bench.splice(DOC, "figures without a title")


def test_the_real_benchmark_files_keep_every_section_a_rerun_would_not_measure() -> None:
    """In each benchmark's file every title stays after splicing a re-measured section back in."""
    for name in bench.SECTIONS:
        text = bench.section_file(name).read_text()
        titles = [bench.section_key(line) for line in text.splitlines() if line.startswith("## ")]
        assert titles, f"{name}.md has no measured section"
        assert len(titles) == len(set(titles)), (
            f"two sections of {name}.md share a title: a re-run would replace the wrong one"
        )
        out = bench.splice(text, f"## {titles[0]} (re-measured)\n\nre-measured\n")
        assert [
            bench.section_key(line) for line in out.splitlines() if line.startswith("## ")
        ] == titles
        assert out.startswith(bench.header(name)) and "re-measured" in out


def test_benchmarks_md_is_short_and_links_every_benchmark_file() -> None:
    """The current results stay readable (at most 3,000 words, as `wc -w` counts) and lead to each file."""
    text = bench.INDEX.read_text()
    assert len(text.split()) <= 3000, f"BENCHMARKS.md has {len(text.split())} words (at most 3,000)"
    assert text.splitlines()[0] == "# Benchmarks" and "## Current results" in text
    files = sorted(bench.OUT_DIR.glob("*.md"))
    assert {f.stem for f in files} >= set(bench.SECTIONS)
    for f in files:
        assert f"(docs/benchmarks/{f.name})" in text, f"BENCHMARKS.md does not link {f.name}"
        assert "[BENCHMARKS.md](../../BENCHMARKS.md)" in f.read_text()


def test_relative_links_in_the_benchmark_files_resolve() -> None:
    """A section moved into docs/benchmarks/ points at images and documents from there, not from the root."""
    for f in [bench.INDEX, *bench.OUT_DIR.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", f.read_text()):
            if "://" not in target:
                assert (f.parent / target).exists(), (
                    f"{f.name} links {target}, which does not exist"
                )


def test_each_benchmark_writes_its_own_file_and_leaves_the_others(tmp_path: Path) -> None:
    (tmp_path / "faces.md").write_text(
        bench.header("faces") + "\n## Faces (old)\n\nold\n\n## Faces: what the rows say\n\nkept\n"
    )
    path = bench.write_section("faces", "## Faces (new)\n\nnew figures\n", tmp_path)
    assert path == tmp_path / "faces.md"
    out = path.read_text()
    assert "new figures" in out and "\n\nold\n" not in out
    assert out.index("new figures") < out.index("kept")
    fresh = bench.write_section("secure_noise", "## Secure noise\n\nx\n", tmp_path / "new")
    assert fresh.read_text() == bench.header("secure_noise") + "## Secure noise\n\nx\n\n"
    assert sorted(p.name for p in tmp_path.rglob("*.md")) == ["faces.md", "secure_noise.md"]


def test_main_writes_the_measured_section_with_machine_and_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Fake:
        @staticmethod
        def run(quick: bool) -> str:
            return "## Secure noise\n\nfresh figures"

    monkeypatch.setattr(bench.importlib, "import_module", lambda name: Fake)
    assert bench.main(["--only", "secure_noise", "--out-dir", str(tmp_path)]) == 0
    out = (tmp_path / "secure_noise.md").read_text()
    assert out.startswith(bench.header("secure_noise")) and "fresh figures" in out
    assert "_Measured by `make bench` (quick (CPU-sized settings)) on " in out
    assert [p.name for p in tmp_path.iterdir()] == ["secure_noise.md"]


def test_a_failing_section_keeps_its_old_figures_and_fails_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "secure_noise.md"
    out.write_text(DOC)
    monkeypatch.setitem(bench.SECTIONS, "secure_noise", "benchmarks.no_such_benchmark")
    assert bench.main(["--only", "secure_noise", "--out-dir", str(tmp_path)]) == 1
    assert out.read_text() == DOC


def test_an_unknown_section_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--only", "nonsense", "--out-dir", str(tmp_path)])
    assert "unknown section(s) nonsense" in capsys.readouterr().err
