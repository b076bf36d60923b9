"""Faces: face-deid against the face re-identification attack, k-SALSA (k = 5) and no anonymisation
beside it, and the time of a 100-photo release.

Data (nothing downloaded; every table says which it is):
- **Real identities**: the photographs that ship inside installed packages: scikit-image's
  astronaut (Eileen Collins), matplotlib's Grace Hopper, insightface's portrait (Tom Hanks) and its
  group photo (six people): 9 faces of 9 people, registered as `photos:` (letterboxed to 512 px).
  k-SALSA needs one square size, so its rows use the 9 faces aligned to 64 x 64.
- **Generated identities**: DCGAN samples (the face generator's own prior, seeds disjoint from the
  mechanism's latent bank), each identity in two views (the image, and a flipped, shifted, darker
  copy): "same person" pairs come from the other view, which is how an attacker holding another
  photo of the person would try.

Per row: verification TAR at dlib's 0.6 and at the thresholds where the FAR on pairs of different
original faces is 1e-3 and 1e-2 (with fewer pairs than 1/FAR: the closest such pair), rank-1
identification against the gallery of original faces (chance in brackets), the mean displacement of
the 68 landmarks in inter-ocular distances (face-deid only: k-SALSA's averages are not at the
original's place) and seconds.

Speed: 100 single-face photographs (the 9 real faces, cut out of their photos with a margin and
jittered: flip, scale, rotation, brightness), 512 px, through face-deid's `run` with its progress
bar, on this machine.

`python -m benchmarks.faces_bench [--grid docs/faces-pairs.png]` prints the Markdown section; `make
bench` (or `python -m benchmarks --only faces`) writes it into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from audit.face_reid import FaceIndex, compute_paired, verification
from audit.policy import AuditPolicy
from benchmarks.common import md_table
from synth import face_models as fm
from synth.datasets import ImageDataset
from synth.faces.config import FaceDeidConfig
from synth.faces.generator import load_generator, render
from synth.faces.run import load_tools
from synth.faces.run import run as face_deid
from synth.photos import letterbox

GRID = Path(__file__).resolve().parent.parent / "docs" / "faces-pairs.png"
POLICY = AuditPolicy(face_samples=1000)
HEADER = [
    "release",
    "genuine pairs",
    "TAR @ 0.6",
    "TAR @ FAR 1e-3",
    "TAR @ FAR 1e-2",
    "impostor pairs",
    "rank-1 (chance)",
    "landmark shift (IOD)",
    "seconds",
]


def _insightface_image(name: str) -> np.ndarray:
    spec = importlib.util.find_spec("insightface")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("insightface is not installed (the Makefile installs it, --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "images" / name
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def real_photos() -> list[tuple[str, np.ndarray]]:
    import skimage.data
    from matplotlib import cbook

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as im:
        grace = np.asarray(im.convert("RGB"))
    return [
        ("astronaut", skimage.data.astronaut()),
        ("grace_hopper", grace),
        ("portrait", _insightface_image("Tom_Hanks_54745.png")),
        ("group", _insightface_image("t1.jpg")),
    ]


def as_dataset(photos: list[np.ndarray], size: int, folder: Path) -> ImageDataset:
    """Photos registered the way `photos-SIZE:DIR` registers them (letterboxed PNGs)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(photos):
        Image.fromarray(p).save(folder / f"{i:04d}.png")
    images = np.stack([letterbox(folder / f"{i:04d}.png", size) for i in range(len(photos))])
    return ImageDataset(images, np.zeros(len(photos), np.int64), ["photo"], f"photos-{size}:")


class _Ctx(SimpleNamespace):
    def on_sensitive_access(self) -> None:
        pass


def run_face_deid(data: ImageDataset, config: FaceDeidConfig, tools=None, bar=None):
    """face-deid's registered `run` (what `release run` calls), with a printed progress line."""
    last = [0.0]

    def progress(stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] > 30:
            print(f"  {stage}: {done}/{total}", flush=True)
            last[0] = now
        if bar is not None:
            bar(stage, done, total)

    ctx = _Ctx(workdir=Path(tempfile.mkdtemp()), progress=progress, public=None, plan=None)
    ctx.cache_dir, ctx.nproc = None, 1
    start = time.perf_counter()
    out = face_deid(config, data, ctx, tools=tools)
    return out, time.perf_counter() - start


def _row(name: str, d: dict, seconds: float | None, shift: bool = True) -> list[object]:
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"

    rank1 = d.get("rank1_identification")
    return [
        name,
        d["n_genuine"],
        f(d["tar_at_threshold"]),
        f(d["tar_at_far_0.001"]),
        f(d["tar_at_far_0.01"]),
        d["n_impostor"],
        "n/a" if rank1 is None else f"{rank1:.3f} ({d['rank1_chance']:.3f})",
        f(d.get("mean_landmark_shift")) if shift else "-",
        "-" if seconds is None else f"{seconds:.0f}",
    ]


def ksalsa_release(crops: np.ndarray, public: np.ndarray, k: int):
    """k-SALSA's registered `run` on aligned crops, its codec trained on generated faces."""
    from synth.ksalsa import KSalsaConfig
    from synth.ksalsa.run import run as ksalsa

    sens = ImageDataset(crops, np.zeros(len(crops), np.int64), ["face"], "aligned faces")
    pub = ImageDataset(public, np.zeros(len(public), np.int64), ["face"], "generated faces")
    ctx = _Ctx(workdir=Path(tempfile.mkdtemp()), progress=lambda *a: None, public=pub, plan=None)
    ctx.cache_dir, ctx.nproc = None, 1
    start = time.perf_counter()
    out = ksalsa(KSalsaConfig.demo(k=k), sens, ctx)
    return sens, out, time.perf_counter() - start


def generated_faces(n: int, seed: int) -> np.ndarray:
    gen = load_generator(None, 100, 64)
    z = torch.randn(n, 100, 1, 1, generator=torch.Generator().manual_seed(seed))
    return np.concatenate([render(gen, z[i : i + 64]) for i in range(0, n, 64)])


# ------------------------------------------------------------------ real identities
def real_tables(config: FaceDeidConfig, tools, grid: Path | None) -> tuple[str, dict]:
    photos = [p for _, p in real_photos()]
    with tempfile.TemporaryDirectory() as tmp:
        data = as_dataset(photos, 512, Path(tmp))
    sources = [np.array([i]) for i in range(len(data))]
    embedder = fm.embedder("dlib")
    rows = []
    none = compute_paired(data.images, sources, data, POLICY, embedder).details
    rows.append(_row("none (the originals)", none, None))
    out, seconds = run_face_deid(data, config, tools)
    deid = compute_paired(out.images, list(out.clusters), data, POLICY, embedder).details
    rows.append(_row("face-deid (defaults)", deid, seconds))
    # k-SALSA: the 9 faces aligned to 64 x 64, codec on generated faces
    faces = [f for img in data.images for f in fm.detect(img)]
    owners = [i for i, img in enumerate(data.images) for _ in fm.detect(img)]
    crops = np.stack(
        [fm.align(data.images[o], f.landmarks, 64) for o, f in zip(owners, faces, strict=True)]
    )
    sens, kout, kseconds = ksalsa_release(crops, generated_faces(512, 10_000), 5)
    knone = compute_paired(sens.images, [np.array([i]) for i in range(len(sens))], sens, POLICY,
                           embedder).details  # fmt: skip
    kdet = compute_paired(kout.images, list(kout.clusters), sens, POLICY, embedder).details
    rows.append(_row("none, aligned 64 x 64 crops", knone, None, shift=False))
    rows.append(
        _row(f"k-SALSA k=5 on the crops ({len(kout.images)} average)", kdet, kseconds, shift=False)
    )
    if grid is not None:
        pairs_grid(data, out, grid)
    table = md_table(HEADER, rows)
    own = out.internal
    note = (
        f"face-deid's own record: {out.parameters['n_faces']} faces, "
        f"{out.parameters['n_faces_generated']} generated, {out.parameters['n_faces_pixelated']} "
        f"pixelated; smallest identity distance it reached {own['min_identity_distance']}, mean "
        f"landmark shift in its own measurement {own['mean_landmark_shift']:.3f}. The attack found "
        f"{deid['n_released_faces']} faces in the released photos "
        f"({deid['original_faces_not_found_in_release']} original face(s) not found there)."
    )
    return table + "\n\n" + note, {"deid": deid, "none": none, "ksalsa": kdet}


def pairs_grid(data: ImageDataset, out, path: Path) -> None:
    """Original | anonymised, each face aligned at 128 px from the full photos, three pairs a
    row, and the group photo before and after."""
    tiles = []
    for row, src in enumerate(int(c[0]) for c in out.clusters):
        for f in fm.detect(data.images[src]):
            a = fm.align(data.images[src], f.landmarks, 128)
            b = fm.align(out.images[row], f.landmarks, 128)
            tiles.append(np.concatenate([a, np.full((128, 4, 3), 255, np.uint8), b], 1))
    gap = np.full((tiles[0].shape[0], 16, 3), 255, np.uint8)
    rows = []
    for i in range(0, len(tiles), 3):
        chunk = tiles[i : i + 3] + [np.full_like(tiles[0], 255)] * (3 - len(tiles[i : i + 3]))
        rows.append(np.concatenate([x for t in chunk for x in (t, gap)][:-1], 1))
    width = rows[0].shape[1]
    group = [i for i, c in enumerate(out.clusters) if len(fm.detect(data.images[int(c[0])])) > 1]
    if group:
        r = group[0]
        before, after = data.images[int(out.clusters[r][0])], out.images[r]
        pair = np.concatenate([before, np.full((512, 8, 3), 255, np.uint8), after], 1)
        scale = width / pair.shape[1]
        pair = np.asarray(
            Image.fromarray(pair).resize((width, round(pair.shape[0] * scale)), Image.LANCZOS)
        )
        rows.append(pair)
    sep = np.full((12, width, 3), 255, np.uint8)
    grid = np.concatenate([x for r in rows for x in (r, sep)][:-1], 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(path, optimize=True)


# ------------------------------------------------------------------ generated identities
def views(n_ids: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two views per generated identity, as 192 px photos: (images, identity of each)."""
    faces = generated_faces(n_ids, seed)
    out, ids = [], []
    for i, face in enumerate(faces):
        second = np.clip(face[:, ::-1].astype(np.float32) * 0.85, 0, 255).astype(np.uint8)
        second = np.roll(second, (2, -2), (0, 1))
        for v in (face, second):
            framed = np.pad(v, ((24, 24), (24, 24), (0, 0)), mode="edge")
            out.append(np.asarray(Image.fromarray(framed).resize((192, 192), Image.BICUBIC)))
            ids.append(i)
    return np.stack(out), np.array(ids)


def identity_numbers(
    probes: list[tuple[int, np.ndarray]], originals: np.ndarray, ids: np.ndarray, index: FaceIndex
) -> dict:
    """Verification and rank-1 of probe images (identity, image) against the original views:
    genuine = same identity, FAR calibrated on originals of different identities."""
    gallery = [
        (int(ids[g]), e) for g in range(len(originals)) for _, e in index.of("o", g, originals[g])
    ]
    g_ids = np.array([i for i, _ in gallery])
    g_emb = np.stack([e for _, e in gallery])
    a, b = np.triu_indices(len(gallery), 1)
    diff = g_ids[a] != g_ids[b]
    reference = np.linalg.norm(g_emb[a] - g_emb[b], axis=1)[diff]
    genuine, hits, chance = [], [], []
    for n, (ident, img) in enumerate(probes):
        for _, e in index.of("p", n, img)[:1]:
            d = np.linalg.norm(g_emb - e, axis=1)
            genuine += d[g_ids == ident].tolist()
            hits.append(bool(g_ids[int(np.argmin(d))] == ident))
            chance.append(float(np.mean(g_ids == ident)))
    out = verification(np.array(genuine), reference, 0.6)
    out["rank1_identification"] = float(np.mean(hits)) if hits else None
    out["rank1_chance"] = float(np.mean(chance)) if chance else None
    return out


def generated_tables(config: FaceDeidConfig, tools, n_ids: int) -> str:
    images, ids = views(n_ids, seed=20_000)
    embedder = fm.embedder("dlib")
    first = np.arange(0, len(images), 2)  # view A of each identity is released
    data = ImageDataset(images[first], np.zeros(len(first), np.int64), ["photo"], "generated")
    rows = []
    index = FaceIndex(embedder)
    # none: view A released as is, matched against view B (the other photo of the person)
    other = ImageDataset(images[first + 1], np.zeros(len(first), np.int64), ["photo"], "b")
    none = identity_numbers([(i, data.images[i]) for i in range(len(first))], other.images,
                            np.arange(len(first)), index)  # fmt: skip
    rows.append(_row("none: view A against view B", none, None, shift=False))
    out, seconds = run_face_deid(data, config, tools)
    released = [(int(c[0]), out.images[r]) for r, c in enumerate(out.clusters)]
    same = compute_paired(out.images, list(out.clusters), data, POLICY, embedder).details
    rows.append(_row("face-deid: released A against original A", same, seconds))
    against_b = identity_numbers(released, other.images, np.arange(len(first)), FaceIndex(embedder))
    rows.append(_row("face-deid: released A against view B", against_b, None, shift=False))
    # k-SALSA on the 64 x 64 views (both views of each identity are records)
    crops = np.stack([np.asarray(Image.fromarray(im).resize((96, 96)))[16:80, 16:80]
                      for im in images])  # fmt: skip
    sens, kout, kseconds = ksalsa_release(crops, generated_faces(512, 30_000), 5)
    kprobes = [(int(ids[s]), kout.images[r]) for r, c in enumerate(kout.clusters) for s in c]
    kdet = identity_numbers(kprobes, crops, ids, FaceIndex(embedder))
    rows.append(
        _row(
            f"k-SALSA k=5 ({len(kout.images)} averages) against its sources' identities",
            kdet,
            kseconds,
            shift=False,
        )
    )
    return md_table(HEADER, rows)


# ------------------------------------------------------------------ speed
def single_face_photos(n: int, seed: int) -> list[np.ndarray]:
    """n photos with one real face each: the 9 faces cut out with a margin, jittered."""
    rng = np.random.default_rng(seed)
    cuts = []
    for _, photo in real_photos():
        for f in fm.detect(photo):
            x0, y0, x1, y1 = f.box
            w = x1 - x0
            box = (int(max(0, x0 - w)), int(max(0, y0 - w)), int(x1 + w), int(y1 + 1.5 * w))
            cuts.append(Image.fromarray(photo).crop(box))
    out = []
    for i in range(n):
        im = cuts[i % len(cuts)]
        if rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        im = im.rotate(float(rng.uniform(-10, 10)), Image.BICUBIC, expand=False)
        s = float(rng.uniform(0.8, 1.6))
        im = im.resize((max(64, round(im.width * s)), max(64, round(im.height * s))))
        arr = np.asarray(im).astype(np.float32) * float(rng.uniform(0.8, 1.1))
        out.append(np.clip(arr, 0, 255).astype(np.uint8))
    return out


def speed_table(n: int) -> str:
    """`privrelease release run` (de-identification, then the audit) of n single-face photos,
    through the installed command as a steward runs it; wall and CPU time."""
    import json
    import resource
    import subprocess

    exe = str(Path(sys.executable).parent / "privrelease")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "photos"
        folder.mkdir()
        for i, photo in enumerate(single_face_photos(n, seed=1)):
            Image.fromarray(photo).save(folder / f"{i:04d}.jpg", quality=92)
        env = {**os.environ, "PRIVRELEASE_HOME": str(root / "ws"), "PRIVRELEASE_ACTOR": "alice"}

        def cli(*args: str) -> str:
            done = subprocess.run([exe, *args], env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"privrelease {' '.join(args)}: {done.stderr[-2000:]}")
            return done.stdout

        cli("init", "--steward", "alice")
        cli("dataset", "register", "photos", "--source", f"photos:{folder}", "--epsilon", "10",
            "--delta", "1e-5")  # fmt: skip
        spec = root / "spec.toml"
        spec.write_text(
            '[release]\ndataset = "photos"\nmechanism = "face-deid"\n[policy]\n'
            "min_utility_gain = 0.0\n"
        )
        rel = json.loads(cli("release", "plan", str(spec), "--json"))["release_id"]
        cli("release", "approve", rel, "--acknowledge-non-dp")
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen([exe, "release", "run", rel], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert proc.stdout is not None
        stages: dict[str, float] = {}
        for line in proc.stdout:  # the progress lines, as in a CI log
            if line.strip().startswith(("face-deid: photos", "audit:")):
                stages[line.strip().split(":")[0] + ":" + line.split(":")[1]] = (
                    time.perf_counter() - start
                )
        if proc.wait():
            raise RuntimeError(f"release run failed (exit {proc.returncode})")
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        deid = max(v for k, v in stages.items() if k.startswith("face-deid"))
        report = json.loads(cli("audit", "report", rel, "--json"))
        shown = json.loads(cli("release", "show", rel, "--json"))
    params = shown["result"]["parameters"]
    return md_table(
        [
            "photos",
            "faces: generated / pixelated",
            "withheld",
            "de-identification s",
            "whole run s (with audit)",
            "CPU s",
            "audit",
            "load (1 min)",
        ],
        [
            [
                n,
                f"{params['n_faces_generated']} / {params['n_faces_pixelated']}",
                params["n_withheld"],
                f"{deid:.0f}",
                f"{wall:.0f}",
                f"{cpu:.0f}",
                "passed" if report["passed"] else "failed",
                f"{load:.1f} -> {os.getloadavg()[0]:.1f}",
            ]
        ],
    )


def run(quick: bool = True, grid: Path | None = GRID, speed: bool = True) -> str:
    torch.manual_seed(0)
    config = FaceDeidConfig()
    tools = load_tools(config)
    real, _ = real_tables(config, tools, grid)
    generated = generated_tables(config, tools, 30 if quick else 200)
    parts = [
        "## Faces (face-deid against the re-identification attack, `python -m benchmarks "
        "--only faces`)",
        "",
        "dlib ResNet descriptor (distance < 0.6 = same person); FAR thresholds calibrated on pairs "
        "of different original faces; landmark shift = mean displacement of the 68 dlib landmarks "
        "(predicted in the original face's box) in inter-ocular distances. Default face-deid "
        "settings (`FaceDeidConfig()`).",
        "",
        "### Real identities (9 faces of 9 people in 4 photographs shipped with scikit-image, "
        "matplotlib and insightface)",
        "",
        real,
        "",
        "### Generated identities (30 DCGAN faces, two views each; not real people)",
        "",
        generated,
    ]
    if speed:
        parts += [
            "",
            "### A release of 100 photographs (one real face each, jittered copies of the 9)",
            "",
            speed_table(100),
        ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grid", type=Path, default=GRID, help="where the pairs grid goes")
    parser.add_argument("--no-speed", action="store_true", help="skip the 100-photo release")
    args = parser.parse_args(argv)
    print(run(grid=args.grid, speed=not args.no_speed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
