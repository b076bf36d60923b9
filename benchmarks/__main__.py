"""`make bench`: run the benchmarks and write BENCHMARKS.md (machine and date included).

    python -m benchmarks [--full] [--only accounting,privimage,recipe,ksalsa,verify,audit,secure_noise,distributed,throughput,query]
"""
from __future__ import annotations

import argparse
import importlib
import traceback
from pathlib import Path

from benchmarks.common import machine, timer, today

SECTIONS = {"accounting": "benchmarks.accounting_bench", "privimage": "benchmarks.privimage_bench",
            "recipe": "benchmarks.recipe_ablation", "ksalsa": "benchmarks.ksalsa_bench",
            "verify": "benchmarks.verify_bench", "audit": "benchmarks.audit_bench",
            "secure_noise": "benchmarks.secure_noise_bench", "distributed": "benchmarks.distributed_bench",
            "throughput": "benchmarks.dpsgd_throughput",
            "query": "benchmarks.semantic_query_bench"}
OUT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="paper-sized settings (hours on CPU; use a GPU)")
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    parts = [f"# Benchmarks\n\nWritten by `make bench` on {today()}.\n\nMachine: {machine()}.\n"
             f"Mode: {'full' if args.full else 'quick (CPU-sized settings)'}.\n"]
    for name in args.only.split(","):
        print(f"== {name}", flush=True)
        with timer() as t:
            try:
                section = importlib.import_module(SECTIONS[name]).run(quick=not args.full)
            except Exception:  # one broken section must not hide the others' figures
                section = f"## {name}\n\nFAILED:\n\n```\n{traceback.format_exc()}\n```"
        parts.append(section + f"\n\n_Section wall time: {t[0]:.0f} s._\n")
        print(section, flush=True)
    args.out.write_text("\n".join(parts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
