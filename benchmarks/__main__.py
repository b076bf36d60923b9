"""`make bench`: run the benchmarks and update BENCHMARKS.md (machine and date included).

    python -m benchmarks [--full] [--only accounting,privimage,recipe,ksalsa,verify,audit,secure_noise,distributed,throughput,query,volumes,faces]

Each measured section replaces the section of BENCHMARKS.md with the same title (the heading's text before
any " ("); sections it does not measure (the main job, explorations, earlier ablations) are kept. A section
that fails leaves its old figures in place, is reported, and makes the command exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import sys
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
OUT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
HEADER = "# Benchmarks\n"


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


def splice(document: str, section: str) -> str:
    """`document` with the section of `section`'s title replaced by it, or `section` appended if it is new."""
    if not section.startswith("## "):
        raise ValueError(
            f"a benchmark section must start with a '## ' heading, got {section[:40]!r}"
        )
    preamble, sections = _split(document or HEADER)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--full", action="store_true", help="paper-sized settings (hours on CPU; use a GPU)"
    )
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    names = args.only.split(",")
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    mode = "full" if args.full else "quick (CPU-sized settings)"
    failed = []
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
                f"FAILED: {name} (its figures in {args.out.name} are left as they were)\n{traceback.format_exc()}",
                flush=True,
            )
            continue
        section = (
            section.rstrip("\n")
            + f"\n\n_Measured by `make bench` ({mode}) on {today()}, {machine()}; "
            f"section wall time {t[0]:.0f} s._\n"
        )
        document = args.out.read_text() if args.out.exists() else ""
        args.out.write_text(
            splice(document, section)
        )  # after each section: a later failure keeps this one
        print(section, flush=True)
    print(f"updated {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
