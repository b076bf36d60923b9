"""`make bench`: run the benchmarks and write each one's measured section (machine and date
included) into its own file, docs/benchmarks/<name>.md.

    python -m benchmarks [--full] [--only NAME,...]   # NAME: a key of SECTIONS below

Each measured section replaces the section of its file with the same title (the heading's text
before any " ("); sections it does not measure (the hand-written readings of the rows) are kept. A
section that fails leaves its old figures in place, is reported, and makes the command exit
non-zero. BENCHMARKS.md, the current result of each mechanism (latest figure, command, machine,
date), is written by hand from these files: `make bench` does not touch it, and says so when done.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
import traceback
from pathlib import Path

from benchmarks.common import machine, timer, today

SECTIONS = {
    "accounting": "benchmarks.accounting_bench",
    "privimage": "benchmarks.privimage_bench",
    "recipe": "benchmarks.recipe_ablation",
    "ksalsa": "benchmarks.ksalsa_bench",
    "verify": "benchmarks.verify_bench",
    "audit": "benchmarks.audit_bench",
    "secure_noise": "benchmarks.secure_noise_bench",
    "distributed": "benchmarks.distributed_bench",
    "throughput": "benchmarks.dpsgd_throughput",
    "query": "benchmarks.semantic_query_bench",
    "volumes": "benchmarks.volumes_bench",
    "faces": "benchmarks.faces_bench",
}
# each file's title (docs/benchmarks/workers.md, Dask workers, is measured by hand with
# benchmarks.item_workers_bench)
TITLES = {
    "accounting": "accounting and ledger",
    "privimage": "PrivImage",
    "recipe": "PrivImage recipe ablation",
    "ksalsa": "k-SALSA",
    "verify": "bundle verification",
    "audit": "one-run audit of the DP-SGD implementation",
    "secure_noise": "secure noise",
    "distributed": "distributed DP-SGD",
    "throughput": "DP-SGD step cost",
    "query": "semantic query",
    "volumes": "head MRI defacing and refacing",
    "faces": "faces (face-deid against re-identification)",
}
ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "BENCHMARKS.md"  # the current results, by hand
OUT_DIR = ROOT / "docs" / "benchmarks"  # one file per benchmark: <name>.md
HEADER = "# Benchmarks\n"


def section_file(name: str, out_dir: Path = OUT_DIR) -> Path:
    """Where benchmark `name`'s measured section lives: <out_dir>/<name>.md."""
    return out_dir / f"{name}.md"


def header(name: str) -> str:
    """The opening of a benchmark's file (what a new one starts with)."""
    text = (
        "The current figure of each mechanism is in [BENCHMARKS.md](../../BENCHMARKS.md); "
        "the dated history in [the lab notebook](../../BENCHMARKS-NOTEBOOK.md). "
        f"`make bench` (`python -m benchmarks --only {name}`) replaces the measured section "
        "below, with its machine and date, and keeps the rest."
    )
    wrapped = textwrap.fill(text, 115, break_long_words=False, break_on_hyphens=False)
    return f"# Benchmark: {TITLES.get(name, name)}\n\n{wrapped}\n"


def section_key(heading: str) -> str:
    """'## k-SALSA (k-anonymous release)' -> 'k-SALSA': a section keeps its title when its subtitle changes."""
    return heading.removeprefix("## ").split(" (")[0].strip()


def _split(document: str) -> tuple[str, list[str]]:
    """The preamble (before the first '## ' heading) and the sections, each from its heading to the next."""
    lines = document.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    if not starts:
        return document, []
    bounds = starts + [len(lines)]
    return "".join(lines[: starts[0]]), ["".join(lines[a:b]) for a, b in zip(bounds, bounds[1:])]


def splice(document: str, section: str, header: str = HEADER) -> str:
    """`document` with the section of `section`'s title replaced by it, or `section` appended if it
    is new (to `header` if `document` is empty)."""
    if not section.startswith("## "):
        raise ValueError(
            f"a benchmark section must start with a '## ' heading, got {section[:40]!r}"
        )
    preamble, sections = _split(document or header)
    key = section_key(section.splitlines()[0])
    body = section.rstrip("\n") + "\n\n"
    for i, old in enumerate(sections):
        if section_key(old.splitlines()[0]) == key:
            sections[i] = body
            break
    else:
        sections.append(body)
        if sections[:-1] and not sections[-2].endswith("\n\n"):
            sections[-2] += "\n"
    return preamble + "".join(sections)


def write_section(name: str, section: str, out_dir: Path = OUT_DIR) -> Path:
    """Splice `section` into benchmark `name`'s file (created with its header if missing); returns
    the file's path."""
    path = section_file(name, out_dir)
    document = path.read_text() if path.exists() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(splice(document, section, header(name)))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--full", action="store_true", help="paper-sized settings (hours on CPU; use a GPU)"
    )
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument(
        "--out-dir", type=Path, default=OUT_DIR, help="where each benchmark's <name>.md is written"
    )
    args = parser.parse_args(argv)
    names = args.only.split(",")
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    mode = "full" if args.full else "quick (CPU-sized settings)"
    failed: list[str] = []
    written: list[Path] = []
    for name in names:
        print(f"== {name}", flush=True)
        try:
            with timer() as t:
                section = importlib.import_module(SECTIONS[name]).run(quick=not args.full)
        except (
            Exception
        ):  # one broken section must not hide the others' figures, nor erase its old ones
            failed.append(name)
            print(
                f"FAILED: {name} (its figures in {section_file(name, args.out_dir)} are left as "
                f"they were)\n{traceback.format_exc()}",
                flush=True,
            )
            continue
        section = (
            section.rstrip("\n")
            + f"\n\n_Measured by `make bench` ({mode}) on {today()}, {machine()}; "
            f"section wall time {t[0]:.0f} s._\n"
        )
        path = write_section(name, section, args.out_dir)  # now: a later failure keeps this one
        written.append(path)
        print(section, flush=True)
    print(
        f"updated {', '.join(str(p) for p in written) or 'nothing'}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if written:
        print(f"bring the matching rows of {INDEX.name}'s current results up to date by hand")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
