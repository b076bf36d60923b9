"""`make reproduce`: reproduce the shape of the seed papers' result tables and write REPRODUCTION.md
with PNG plots in reproduction/.

    python -m benchmarks.reproduce [--micro | --full] [--out REPRODUCTION.md] [--only privimage,ksalsa,audit]
    python -m benchmarks.reproduce --only audit      # the one-run DP-SGD audit alone (about a minute)
    python -m benchmarks.reproduce --report-only     # re-write the report from
    reproduction/results.json

Default: CPU-sized settings (the demo's recipe; PrivImage three times per epsilon). --micro: a smoke run
of the whole pipeline (minutes; numbers meaningless). --full: GPU-sized settings (uses CUDA when present).
Raw numbers go to reproduction/results.json; a section not re-run (--only) is taken from there
when its mode matches, so a long run can be completed piecewise. `--only audit` rewrites only the
audit section (3) of an existing REPRODUCTION.md, leaving the other sections' text as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine, today
from benchmarks.reproduce_settings import AUDIT_EPSILONS, EPSILONS, KS, settings

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("privimage", "ksalsa", "audit")
AUDIT_HEADING = "## 3. "
MODE_TEXT = {
    "micro": "MICRO smoke run (pipeline check only: tiny models, a few steps; the numbers mean nothing)",
    "cpu": (
        "CPU default (`make reproduce`): the demo's recipe on 2 CPU cores (small UNet, 2,000 public "
        "pre-training steps, 4 DP-SGD epochs, the private vote), PrivImage three times per epsilon (this "
        "run's time is given below)"
    ),
    "full": "full (`--full`): GPU-sized settings",
}


def _jsonable(x: Any) -> Any:
    """Results as JSON; epsilon = infinity kept as "inf" (read back by _unjson)."""
    from audit.report import jsonable

    return jsonable(x, inf_as_text=True)


def _unjson(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unjson(v) for v in x]
    return float("inf") if x == "inf" else x


def build_report(results: dict[str, Any], plots: dict[str, Any]) -> str:
    s = results["settings"]
    L = [
        "# Reproduction of the seed papers' result tables",
        "",
        f"Written by `python -m benchmarks.reproduce{'' if s['mode'] == 'cpu' else ' --' + s['mode']}` on "
        f"{results['date']}.",
        "",
        f"**Mode: {MODE_TEXT[s['mode']]}.**",
        "",
        *(
            [
                "> This file comes from the micro smoke run: it shows that the whole pipeline (the charged PrivImage runs, "
                "the audit, 15 k-SALSA releases, tables, plots) runs end to end, but its models are a few optimisation "
                "steps old, so no number or ordering below says anything about the papers (except in a section "
                "marked with another mode). Run `make reproduce` (CPU "
                "default) or `python -m benchmarks.reproduce --full` on a "
                "GPU for meaningful tables.",
                "",
            ]
            if s["mode"] == "micro"
            else []
        ),
        f"Hardware: {results['machine']}; torch threads {results['threads']}.",
        f"Seeds: {s['seed']} (data subsets, model initialisation, sampling noise, classifiers, attack splits). "
        f"Repeats: {s.get('privimage_repeats', 1)} runs of each PrivImage setting (mean and spread below), "
        f"{s['repeats']} of every other setting. The DP noise and the "
        "Poisson sampling of DP-SGD are seeded from OS entropy by design (a public seed would let anyone subtract the "
        "noise), so DP rows are not bit-reproducible and differ run to run.",
        f"Total time: {results['seconds'] / 60:.1f} min.",
        "",
    ]
    for name, err in results.get("errors", {}).items():
        L += [f"**Section {name} FAILED**: `{err}`", ""]
    L += section_texts(results, plots).values()
    L += [
        "## Settings of the other modes",
        "",
        "CPU default vs `--full` (GPU) vs `--micro` (smoke); see benchmarks/reproduce_settings.py:",
        "",
    ]
    from benchmarks.reproduce_settings import MODES
    from benchmarks.reproduce_settings import settings as all_settings

    for m in MODES:
        L.append(f"- **{m}**: {json.dumps(_jsonable(all_settings(m)))}")
    L.append("")
    return "\n".join(L)


def section_texts(results: dict[str, Any], plots: dict[str, Any]) -> dict[str, str]:
    """The report's numbered sections present in `results`, in order: privimage, ksalsa, audit."""
    from benchmarks.reproduce_report import audit_section, ksalsa_section, privimage_section

    s, out = results["settings"], {}
    for name in ("privimage", "ksalsa"):
        if name in results:
            r = results[name]
            text = {"privimage": privimage_section, "ksalsa": ksalsa_section}[name](
                r, r.get("settings", s), plots
            )
            out[name] = _mode_note(text, r.get("mode", s["mode"]), s["mode"])
    if (
        "privimage" in results or "audit" in results
    ):  # the MIA comes from privimage, the one-run audit from audit
        mia, one_run = results.get("privimage"), results.get("audit")
        text = audit_section(mia, one_run, (mia or one_run).get("settings", s), plots)
        modes = {r.get("mode", s["mode"]) for r in (mia, one_run) if r}
        out["audit"] = _mode_note(text, modes.pop() if len(modes) == 1 else s["mode"], s["mode"])
    return out


def _mode_note(text: str, section_mode: str, mode: str) -> str:
    """A section completed by a run in another mode says so under its heading."""
    if section_mode == mode:
        return text
    head, _, rest = text.partition("\n")
    return f"{head}\n\n**This section: {MODE_TEXT[section_mode]}.**\n{rest}"


def write_plots(results: dict[str, Any], out_dir: Path, grids: list[str]) -> dict[str, Any]:
    from benchmarks import reproduce_plots as rp

    plots: dict[str, Any] = {"grids": sorted(grids)}
    if "privimage" in results:
        plots["privimage"] = rp.privimage_curves(results["privimage"], out_dir)
        plots["audit"] = rp.audit_roc(results["privimage"]["audit"], out_dir)
    if results.get("audit", {}).get("rows"):
        plots["one_run"] = rp.one_run_scores(results["audit"]["rows"], out_dir)
    if "ksalsa" in results:
        plots["ksalsa"] = rp.ksalsa_curves(results["ksalsa"], out_dir)
    return plots


def rewrite_report(out: Path) -> None:
    out_dir = out.resolve().parent / "reproduction"
    raw_path = out_dir / "results.json"
    if not raw_path.exists():
        sys.exit(f"{raw_path} does not exist: run `make reproduce` first.")
    write_report(
        _unjson(json.loads(raw_path.read_text())),
        out,
        [p.name for p in out_dir.glob("*_grid*.png")],
    )
    print(f"wrote {out} from {raw_path}", file=sys.stderr)


def write_report(results: dict[str, Any], out: Path, grids: list[str]) -> None:
    """REPRODUCTION.md at `out`, its plots beside it in reproduction/."""
    plots = write_plots(results, out.resolve().parent / "reproduction", grids)
    out.write_text(build_report(results, plots))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_true", help="GPU-sized settings")
    g.add_argument("--micro", action="store_true", help="smoke run of the whole pipeline (minutes)")
    ap.add_argument("--out", type=Path, default=ROOT / "REPRODUCTION.md")
    ap.add_argument(
        "--only", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS)
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="re-write REPRODUCTION.md and the plots from reproduction/results.json; train nothing",
    )
    return ap


def _run_section(
    name: str, s: dict[str, Any], tmp: Path, grid: Any, out_dir: Path, save: Callable[[dict], None]
) -> dict[str, Any]:
    if name == "privimage":
        from benchmarks.reproduce_privimage import run as run_privimage

        return run_privimage(s, tmp, grid, samples_dir=out_dir / "samples", save=save)
    if name == "audit":
        from benchmarks.reproduce_audit import run as run_audit

        return {**run_audit(s), "date": today(), "machine": machine()}
    from benchmarks.reproduce_ksalsa import run as run_ksalsa

    return run_ksalsa(s, tmp, grid)


def splice_audit_section(results: dict[str, Any], out: Path) -> bool:
    """Replace section 3 of an existing report with the current one (plots re-drawn); False if `out`
    has no such section (then the caller writes the whole report)."""
    text = out.read_text() if out.exists() else ""
    start = text.find("\n" + AUDIT_HEADING)
    if start < 0:
        return False
    end = text.find("\n## ", start + 1)
    plots = write_plots(results, out.resolve().parent / "reproduction", [])
    section = section_texts(results, plots)["audit"]
    out.write_text(text[: start + 1] + section + (text[end:] if end >= 0 else "\n"))
    return True


def main(argv: list[str] | None = None) -> None:
    import torch

    from benchmarks import reproduce_plots as rp

    ap = _parser()
    args = ap.parse_args(argv)
    if args.report_only:
        rewrite_report(args.out)
        return
    mode = "full" if args.full else "micro" if args.micro else "cpu"
    only = [x for x in args.only.split(",") if x]
    if set(only) - set(SECTIONS):
        ap.error(f"--only takes {SECTIONS}")
    if not torch.cuda.is_available():
        torch.set_num_threads(min(2, torch.get_num_threads()))
    s = {
        **settings(mode),
        "epsilons": list(EPSILONS),
        "audit_epsilons": list(AUDIT_EPSILONS),
        "ks": list(KS),
    }
    out_dir = args.out.resolve().parent / "reproduction"
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / "results.json"
    previous = _unjson(json.loads(raw_path.read_text())) if raw_path.exists() else {}
    if previous.get("settings", {}).get("mode") != mode:
        previous = {}
    audit_only = only == ["audit"] and bool(previous)  # the header keeps describing the main run
    results: dict[str, Any] = {
        "settings": s,
        "machine": machine(),
        "date": today(),
        "threads": torch.get_num_threads(),
        "errors": {},
    }
    if audit_only:
        results.update({k: previous[k] for k in ("machine", "date", "threads") if k in previous})
    results["errors"] = {k: v for k, v in previous.get("errors", {}).items() if k not in only}
    grids: list[str] = [p.name for p in out_dir.glob("*_grid*.png")] if previous else []
    results.update({old: previous[old] for old in SECTIONS if old not in only and old in previous})

    def grid(name: str, images: np.ndarray, labels: np.ndarray) -> None:
        fname = f"{name}_grid.png"
        rp.image_grid(out_dir / fname, images, labels, name.replace("_", " "), s["grid_per_class"])
        if fname not in grids:
            grids.append(fname)

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="privrelease-reproduce-") as tmp:
        for name in only:
            print(f"== {name} ({mode})", file=sys.stderr, flush=True)

            def save(
                partial: dict[str, Any], name: str = name
            ) -> None:  # kept if the run stops early
                results[f"{name}_partial"] = {**partial, "mode": mode, "settings": s}
                raw_path.write_text(json.dumps(_jsonable(results), indent=1))

            try:
                results[name] = {
                    **_run_section(name, s, Path(tmp), grid, out_dir, save),
                    "mode": mode,
                    "settings": s,
                }
                results.pop(f"{name}_partial", None)
            except Exception as exc:  # keep the other section's results; say what failed
                traceback.print_exc()
                results["errors"][name] = f"{type(exc).__name__}: {exc}"
            raw_path.write_text(json.dumps(_jsonable(results), indent=1))
    results["seconds"] = (
        time.time()
        - t0
        + sum(
            previous.get(x, {}).get("seconds", 0.0)
            for x in SECTIONS
            if x not in only and x in previous
        )
    )
    raw_path.write_text(json.dumps(_jsonable(results), indent=1))
    if not (audit_only and "audit" in results and splice_audit_section(results, args.out)):
        write_report(results, args.out, grids)
    print(f"wrote {args.out} and {out_dir}/", file=sys.stderr)
    if results["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
