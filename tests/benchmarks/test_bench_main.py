"""`make bench` updates BENCHMARKS.md section by section: what it measures is replaced, the rest is kept,
and a failing section neither erases its old figures nor passes silently."""

from __future__ import annotations

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


def test_the_real_benchmarks_file_keeps_every_section_a_rerun_would_not_measure() -> None:
    """Every title in BENCHMARKS.md stays after splicing each measured section's heading back in."""
    text = bench.OUT.read_text()
    titles = [bench.section_key(line) for line in text.splitlines() if line.startswith("## ")]
    assert len(titles) == len(set(titles)), (
        "two sections share a title: a re-run would replace the wrong one"
    )
    out = text
    for title in ["Accounting and ledger", "Secure noise", "k-SALSA (k-anonymous release)"]:
        out = bench.splice(out, f"## {title}\n\nre-measured\n")
    assert [
        bench.section_key(line) for line in out.splitlines() if line.startswith("## ")
    ] == titles


def test_a_failing_section_keeps_its_old_figures_and_fails_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(DOC)
    monkeypatch.setitem(bench.SECTIONS, "secure_noise", "benchmarks.no_such_benchmark")
    assert bench.main(["--only", "secure_noise", "--out", str(out)]) == 1
    assert out.read_text() == DOC


def test_an_unknown_section_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--only", "nonsense", "--out", str(tmp_path / "B.md")])
    assert "unknown section(s) nonsense" in capsys.readouterr().err
