"""Head MRI defacing and refacing (issue 44): speed, the brain left intact, the face changed, and
re-identification of face renders, on a SYNTHETIC cohort.

    python -m benchmarks.volumes_bench [--subjects 12] [--mm 1.0]   # make bench: "volumes"

The cohort (synth.tools.mri.cohort): distinct heads made from Colin27 and pydeface's average head by
random affine + elastic deformations (torchio). For every mechanism the audit's own computation
(audit.volumes: Colin27 registered to each original) gives the brain voxels changed, the face's
detail and plain correlation with the original, and rank-1 re-identification of face renders among
the originals. Writes the "Head MRI" section of docs/benchmarks/volumes.md and the before/after
render grid docs/volumes-renders.png.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import machine, md_table, today

ROOT = Path(__file__).resolve().parent.parent
GRID_PNG = ROOT / "docs" / "volumes-renders.png"
METHODS = ("none", "deface quickshear", "deface mask", "reface")


def _cohort(n: int, mm: float, seed: int = 0):
    from synth.kinds.nifti import load_volume_folder
    from synth.tools.mri.cohort import make_cohort

    folder = Path(tempfile.gettempdir()) / f"privrelease-bench-heads-{mm:g}mm-{n}-seed{seed}"
    if len(list(folder.glob("subject-*.nii.gz"))) != n:
        t = time.perf_counter()
        make_cohort(folder, n, mm=mm, seed=seed)
        print(f"cohort of {n} at {mm:g} mm made in {time.perf_counter() - t:.0f} s", flush=True)
    return load_volume_folder(folder)


def _edit(method: str, subject, atlas):
    from synth.mechanisms.deface_reface import edit
    from synth.mechanisms.deface_reface import replacement_faces as faces

    if method == "none":
        return subject
    if method == "reface":
        return edit.reface(subject, atlas, 5.0, faces.load("template")).volume
    return edit.deface(subject, atlas, method.split()[1], 5.0, 10).volume


def measure(n: int = 8, mm: float = 1.0, cache: Path | None = None) -> dict:
    from audit.volumes import (
        compare,
        face_region,
        face_window,
        normalised_depth,
        recognise,
        recogniser_picture,
        reidentify,
    )
    from synth.tools import face_recognisers as fr
    from synth.tools.mri.atlas import atlases
    from synth.tools.mri.cohort import BASES
    from synth.tools.mri.render import head_level, surface_in

    cohort = _cohort(n, mm)
    t = time.perf_counter()
    face_atlas, brain_atlas = atlases(cache)
    face_atlas.pyramid  # noqa: B018
    atlas_s = time.perf_counter() - t
    window = face_window(brain_atlas)
    face3d = face_region(brain_atlas, window)
    regs = [brain_atlas.register(v) for v in cohort.volumes]
    masks = [brain_atlas.on(v, r) for v, r in zip(cohort.volumes, regs, strict=True)]
    levels = [head_level(v.physical()) for v in cohort.volumes]
    depth_o = [
        normalised_depth(v, r, window, lv)
        for v, r, lv in zip(cohort.volumes, regs, levels, strict=True)
    ]
    face_px = [surface_in(face3d, d) for d in depth_o]
    recogniser = fr.recogniser("dlib")  # the audit runs all of audit.volumes.RECOGNISERS
    pics_o = [recogniser_picture(v) for v in cohort.volumes]
    results, outputs = {}, {}
    for method in METHODS:
        rows, seconds, depth_r, outs = [], [], [], []
        for i, subject in enumerate(cohort.volumes):
            t = time.perf_counter()
            out = _edit(method, subject, face_atlas)
            seconds.append(time.perf_counter() - t)
            outs.append(out)
            rows.append(compare(f"s{i}", subject, out, masks[i], None))
            depth_r.append(normalised_depth(out, regs[i], window, levels[i]))
        reid = reidentify(depth_o, depth_r, face_px)
        per_base = {}
        for base in BASES:  # matched among the originals made from the same head only
            idx = [i for i in range(n) if BASES[i % len(BASES)] == base]
            if len(idx) > 1:
                per_base[base] = reidentify(
                    [depth_o[i] for i in idx], [depth_r[i] for i in idx], [face_px[i] for i in idx]
                )
        rec = recognise(pics_o, [recogniser_picture(v) for v in outs], recogniser)
        results[method] = {
            "rows": rows,
            "seconds": seconds,
            "reid": reid,
            "per_base": per_base,
            "recogniser": rec,
        }
        outputs[method] = outs
        print(method, f"rank-1 {reid.rank1:.2f}", rec, flush=True)
    return {
        "n": n,
        "mm": mm,
        "atlas_s": atlas_s,
        "results": results,
        "outputs": outputs,
        "cohort": cohort,
        "bases": [BASES[i % len(BASES)] for i in range(n)],
    }


def render_grid(m: dict, path: Path = GRID_PNG, subjects: int = 4) -> None:
    from PIL import Image

    from synth.tools.mri.render import picture, picture_grid

    rows = []
    for i in range(min(subjects, m["n"])):
        row = [picture(m["cohort"].volumes[i], 192, 1.4)]
        row += [picture(m["outputs"][k][i], 192, 1.4) for k in METHODS[1:]]
        rows.append(row)
    Image.fromarray(picture_grid(rows, gap=6)).save(path)


def section(m: dict) -> str:
    res = m["results"]
    table = []
    for method in METHODS:
        r = res[method]
        rows = r["rows"]
        by_base = {}
        for base in sorted(set(m["bases"])):
            picked = [x for x, b in zip(rows, m["bases"], strict=True) if b == base]
            by_base[base] = (
                statistics.median(x.face_correlation for x in picked),
                statistics.median(x.face_correlation_plain for x in picked),
            )
        brain_ok = sum(x.brain_voxels_changed == 0 for x in rows)
        reid = r["reid"]
        within = " / ".join(
            f"{round(x.rank1 * len(x.matches))}/{len(x.matches)}" for x in r["per_base"].values()
        )
        rec = r["recogniser"]
        recognised = (
            "not run (fewer than 2 original renders show a face)"
            if rec is None
            else f"{rec.hits}/{rec.originals_with_face} (p = {rec.p_value:.2g}); faces found in "
            f"{rec.released_with_face}/{len(rows)}"
        )
        table.append(
            [
                method,
                f"{brain_ok}/{len(rows)}",
                " / ".join(f"{v[0]:.2f}" for v in by_base.values()),
                " / ".join(f"{v[1]:.2f}" for v in by_base.values()),
                f"{round(reid.rank1 * len(rows))}/{len(rows)} = {reid.rank1:.2f} "
                f"(p = {reid.p_value:.2g})",
                within,
                recognised,
                "-" if method == "none" else f"{statistics.median(r['seconds']):.1f}",
            ]
        )
    bases = " / ".join(sorted(set(m["bases"])))
    return "\n".join(
        [
            "## Head MRI defacing and refacing (`python -m benchmarks.volumes_bench`)",
            "",
            f"**Synthetic cohort** (not people): {m['n']} heads at {m['mm']:g} mm, made from "
            "Colin27 and pydeface's average head (alternately) by random affine + elastic "
            "deformations (torchio, `synth.tools.mri.cohort`). Measured with the audit's own "
            "computation (`audit.volumes`: Colin27 registered to each original, independently of "
            "the mechanisms, which register pydeface's head). Face correlation: Pearson "
            "correlation with the original over the face region, of the detail (intensity minus "
            "its 2 mm blur; gated at 0.3) and of the plain intensities (reported), median per "
            f"base head ({bases}). Rank-1: each released head's face render matched among the "
            f"{m['n']} original renders (chance {1 / m['n']:.2f}; p: one-sided binomial test), "
            "and among the originals made from the same base head only. Face recogniser: the "
            "photo audit's CenterFace + dlib descriptor on a shaded frontal render of each head "
            "(1 mm pixels, not pose-normalised), each released face named as the nearest of the "
            "original renders' faces (chance one over the originals with a face); a render with "
            "no face found names nobody. "
            "Seconds: one head, registration included (ITK on one thread, for reproducible "
            "registrations); the atlases (one "
            f"template-to-template registration, public data, cached) took {m['atlas_s']:.0f} s "
            "once.",
            "",
            md_table(
                [
                    "method",
                    "brain voxels identical",
                    "face detail corr.",
                    "face plain corr.",
                    "rank-1 re-identification",
                    "rank-1 within each base",
                    "face recogniser rank-1",
                    "s per head",
                ],
                table,
            ),
            "",
            "Before/after renders: [docs/volumes-renders.png](../volumes-renders.png) "
            "(columns: original, quickshear, mask, reface).",
        ]
    )


def run(quick: bool = True) -> str:
    m = measure(12, 1.0)
    render_grid(m)
    return section(m)


def main() -> None:
    from benchmarks.__main__ import write_section

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--subjects", type=int, default=12)
    parser.add_argument("--mm", type=float, default=1.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    t = time.perf_counter()
    m = measure(args.subjects, args.mm)
    render_grid(m)
    text = section(m) + (
        f"\n\n_Measured on {today()}, {machine()}; wall time {time.perf_counter() - t:.0f} s._\n"
    )
    print(text)
    if not args.no_write:
        write_section("volumes", text)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
