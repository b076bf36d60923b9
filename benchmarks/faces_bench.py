"""Faces: the field's table. No anonymisation, a Gaussian blur (sigma 8) and pixelation (8 blocks)
over each face, k-SALSA (k = 5) and face-deid side by side, each attacked by three recognisers of
different families, each with its own detection and alignment (synth.tools.face_recognisers: dlib,
SFace, FaceNet; face-deid searches against SFace and FaceNet, dlib is held out), and judged for
realism by an independent detector (YuNet).

Data (nothing downloaded; every table says which it is):
- **Real identities**: the photographs that ship inside installed packages: scikit-image's
  astronaut (Eileen Collins), matplotlib's Grace Hopper, insightface's portrait (Tom Hanks) and its
  group photo (six people): 9 faces of 9 people, registered as `photos:` (letterboxed to 512 px).
  k-SALSA needs one square size, so its rows use the 9 faces aligned to 64 x 64.
- **Generated identities**: DCGAN samples (the face generator's own prior, seeds disjoint from the
  mechanism's latent bank), each identity in two views (the image, and a flipped, shifted, darker
  copy). View A is released; the attacker's gallery holds view B, the other photo of the person.

Per release and recogniser: verification TAR at the recogniser's published threshold and at the
threshold where its FAR on pairs of different original faces is 1e-3 (with fewer pairs than 1,000:
the closest such pair), rank-1 identification against the gallery (hits / trials, chance, and the
one-sided binomial p-value the audit gates at 0.05). Realism (releases that keep the photo's
frame): the share of faces YuNet still finds (IoU >= 0.5, confidence >= 0.8), the mean shift of
YuNet's 5 landmarks in inter-ocular distances, and KID (x 1e3) of FaceNet features of the face
crops against the originals'.

Speed: 100 single-face photographs (the 9 real faces, cut out of their photos with a margin and
jittered: flip, scale, rotation, brightness), 512 px, through `privrelease release run` with its
progress bar, on this machine.

`python -m benchmarks.faces_bench [--grid docs/faces-pairs.png]` prints the Markdown section; `make
bench` (or `python -m benchmarks --only faces`) writes it into docs/benchmarks/faces.md.
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

from audit.face_reid import (
    SightingIndex,
    blur_face,
    compute_paired,
    compute_realism,
    pixelate_face,
    rank1_p_value,
    verification,
)
from audit.policy import AuditPolicy
from benchmarks.common import md_table
from release.executor import InProcess, ItemMapper
from synth.kinds.datasets import ImageDataset
from synth.kinds.photos import letterbox
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.generator import load_generator, render
from synth.mechanisms.face_deid.run import load_tools
from synth.mechanisms.face_deid.run import run as face_deid
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr

GRID = Path(__file__).resolve().parent.parent / "docs" / "faces-pairs.png"
POLICY = AuditPolicy.from_dict({"face_samples": 1000})
RECOGNISERS = ("dlib", "sface", "facenet")
HEADER = [
    "release",
    "recogniser",
    "TAR @ threshold",
    "TAR @ FAR 1e-3",
    "rank-1 hits (chance, p)",
    "YuNet finds",
    "landmark shift (IOD)",
    "KID x 1e3",
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
    """The runner's context less the ledger, its items mapped in this process."""

    def __init__(self, workdir: Path, progress, **rest) -> None:
        super().__init__(workdir=workdir, progress=progress, **rest)
        self.map_items = ItemMapper(InProcess(), progress, workdir)

    def on_sensitive_access(self) -> None:
        pass

    def prepare_workers(self, setup, *args):
        return self.map_items.setup(setup, *args)


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


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _rank1(d: dict) -> str:
    if not d.get("rank1_trials"):
        return "n/a"
    p = d.get("rank1_p_value")
    return (
        f"{d['rank1_hits']}/{d['rank1_trials']} ({d['rank1_chance']:.3f}, "
        + ("n/a" if p is None else f"p {p:.3f}")
        + ")"
    )


def _rows(name: str, per: dict[str, dict], realism: dict | None, seconds: float | None) -> list:
    """One row per recogniser; the realism columns on the first."""
    rows = []
    for n, key in enumerate(RECOGNISERS):
        d = per[key]
        r = realism if (n == 0 and realism) else None
        kid = None if r is None or r.get("kid_release") is None else 1e3 * r["kid_release"]
        rows.append(
            [
                name if n == 0 else "",
                key,
                _f(d["tar_at_threshold"]),
                _f(d.get("tar_at_far_0.001")),
                _rank1(d),
                "" if r is None else _f(r["detection_retention"]),
                "" if r is None else _f(r["mean_landmark_shift_yunet5"]),
                "" if kid is None else f"{kid:.1f}",
                "-" if seconds is None or n else f"{seconds:.0f}",
            ]
        )
    return rows


def attack_all(images: np.ndarray, sources: list[np.ndarray], data: ImageDataset) -> dict:
    return {
        k: compute_paired(images, sources, data, POLICY, fr.recogniser(k)).details
        for k in RECOGNISERS
    }


def obscured(images: np.ndarray, how) -> np.ndarray:
    """Every face YuNet finds (confidence >= 0.6) blurred or pixelated over its box."""
    out = []
    for img in images:
        work = img.copy()
        for row in fr.yunet_detect(img):
            work = how(work, fr.yunet_box(row))
        out.append(work)
    return np.stack(out)


def ksalsa_release(crops: np.ndarray, public: np.ndarray, k: int):
    """k-SALSA's registered `run` on aligned crops, its codec trained on generated faces."""
    from synth.mechanisms.ksalsa import KSalsaConfig
    from synth.mechanisms.ksalsa.run import run as ksalsa

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
    rows, numbers = [], {}
    out, seconds = run_face_deid(data, config, tools)
    variants = [
        ("none (the originals)", data.images, sources, None),
        ("blur sigma 8 over each face", obscured(data.images, blur_face), sources, None),
        ("pixelation, 8 blocks", obscured(data.images, pixelate_face), sources, None),
        ("face-deid (defaults)", out.images, list(out.clusters), seconds),
    ]
    if config.replacement == "average":  # the k-Same-M path's other geometry (issue 64)
        other, other_s = run_face_deid(data, config.with_(geometry="attribute"), tools)
        variants.append(
            ("face-deid, attribute geometry", other.images, list(other.clusters), other_s)
        )
        variants.append(
            ("face-deid, DCGAN for every face", _dcgan_release(data, config, tools), sources, None)
        )
    for name, images, srcs, secs in variants:
        per = attack_all(images, srcs, data)
        realism = compute_realism(images, srcs, data, POLICY)
        numbers[name] = {"per": per, "realism": realism}
        rows += _rows(name, per, realism, secs)
    # k-SALSA: the 9 faces aligned to 64 x 64, codec on generated faces
    faces = [f for img in data.images for f in fm.detect(img)]
    owners = [i for i, img in enumerate(data.images) for _ in fm.detect(img)]
    crops = np.stack(
        [fm.align(data.images[o], f.landmarks, 64) for o, f in zip(owners, faces, strict=True)]
    )
    sens, kout, kseconds = ksalsa_release(crops, generated_faces(512, 10_000), 5)
    kper = attack_all(kout.images, list(kout.clusters), sens)
    rows += _rows(f"k-SALSA k=5 on aligned crops ({len(kout.images)} average)", kper, None,
                  kseconds)  # fmt: skip
    if grid is not None:
        pairs_grid(data, out, grid)
    table = md_table(HEADER, rows)
    p = out.parameters
    note = (
        f"face-deid's own record: {p['n_faces']} faces, {p['n_faces_generated']} generated, "
        f"{p['n_faces_pixelated']} pixelated; searched against "
        f"{', '.join(p['searched_recognisers'])} (targets {p['search_targets']}); the audit's "
        "other recognisers held out. KID of the blurred and pixelated faces, for comparison: "
        + ", ".join(
            f"{k} {1e3 * v:.1f}"
            for k, v in (
                ("blur", numbers["face-deid (defaults)"]["realism"]["kid_blurred"]),
                ("pixelation", numbers["face-deid (defaults)"]["realism"]["kid_pixelated"]),
            )
            if v is not None
        )
        + " (x 1e3, same crops)."
    )
    return table + "\n\n" + note, numbers


def _dcgan_release(data: ImageDataset, config: FaceDeidConfig, tools) -> np.ndarray:
    """The released photos of the DCGAN search for every face (`replacement = "generated"`)."""
    out, _ = run_face_deid(data, config.with_(replacement="generated"), tools)
    return out.images


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
    rec: fr.Recogniser, probes: list[tuple[int, np.ndarray]], gallery_images: np.ndarray,
    ids: np.ndarray,
) -> dict:  # fmt: skip
    """One recogniser's verification and rank-1 of probe photos (identity, image) against a
    gallery of other photos: genuine = same identity, FAR calibrated on gallery photos of
    different identities, each probe's largest face."""
    index = SightingIndex(rec)
    gallery = [(int(ids[g]), s.embedding) for g in range(len(gallery_images))
               for s in index.of("g", g, gallery_images[g])[:1]]  # fmt: skip
    g_ids = np.array([i for i, _ in gallery])
    g_emb = np.stack([e for _, e in gallery])
    a, b = np.triu_indices(len(gallery), 1)
    diff = g_ids[a] != g_ids[b]
    reference = rec.distances(g_emb[a][diff], g_emb[b][diff])
    genuine, hits, chance = [], [], []
    for n, (ident, img) in enumerate(probes):
        seen = index.of("p", n, img)[:1]
        if not seen or not (g_ids == ident).any():
            genuine.append(float("inf"))  # the attacker's detector finds no face: no match
            hits.append(False)
            chance.append(1.0 / len(gallery))
            continue
        d = rec.distances(g_emb, seen[0].embedding[None])
        genuine += d[g_ids == ident].tolist()
        hits.append(bool(g_ids[int(np.argmin(d))] == ident))
        chance.append(float(np.mean(g_ids == ident)))
    out = verification(np.array(genuine), reference, rec.threshold)
    mean_chance = float(np.mean(chance))
    out.update(
        rank1_hits=int(sum(hits)),
        rank1_trials=len(hits),
        rank1_chance=mean_chance,
        rank1_p_value=rank1_p_value(int(sum(hits)), len(hits), mean_chance),
    )
    return out


def generated_tables(config: FaceDeidConfig, tools, n_ids: int) -> tuple[str, dict]:
    images, _ = views(n_ids, seed=20_000)
    first = np.arange(0, len(images), 2)  # view A of each identity is released
    data = ImageDataset(images[first], np.zeros(len(first), np.int64), ["photo"], "generated")
    other = images[first + 1]  # view B: the attacker's gallery
    ids = np.arange(len(first))
    sources = [np.array([i]) for i in range(len(first))]
    out, seconds = run_face_deid(data, config, tools)
    rows, numbers = [], {}
    released = {int(c[0]): out.images[r] for r, c in enumerate(out.clusters)}
    variants = [
        ("none", data.images, sources, None),
        ("blur sigma 8", obscured(data.images, blur_face), sources, None),
        ("pixelation, 8 blocks", obscured(data.images, pixelate_face), sources, None),
        ("face-deid (defaults)", out.images, list(out.clusters), seconds),
    ]
    for name, imgs, srcs, secs in variants:
        probes = [(int(s[0]), imgs[r]) for r, s in enumerate(srcs)]
        per = {k: identity_numbers(fr.recogniser(k), probes, other, ids) for k in RECOGNISERS}
        realism = compute_realism(imgs, srcs, data, POLICY)
        numbers[name] = {"per": per, "realism": realism}
        rows += _rows(name, per, realism, secs)
    # k-SALSA on the 64 x 64 views (view A of each identity), attacked with view B
    crop = [np.asarray(Image.fromarray(im).resize((96, 96)))[16:80, 16:80] for im in data.images]
    sens, kout, kseconds = ksalsa_release(np.stack(crop), generated_faces(512, 30_000), 5)
    kprobes = [(int(s), kout.images[r]) for r, c in enumerate(kout.clusters) for s in c]
    kper = {k: identity_numbers(fr.recogniser(k), kprobes, other, ids) for k in RECOGNISERS}
    rows += _rows(f"k-SALSA k=5 ({len(kout.images)} averages)", kper, None, kseconds)
    note = (
        f"{len(released)} of {len(first)} photos released by face-deid "
        f"({out.parameters['n_faces_pixelated']} faces pixelated)."
    )
    return md_table(HEADER, rows) + "\n\n" + note, numbers


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
                "passed"
                if report["passed"]
                else "failed: "
                + ", ".join(r["name"] for r in report["results"] if r["passed"] is False),
                f"{load:.1f} -> {os.getloadavg()[0]:.1f}",
            ]
        ],
    )


def run(quick: bool = True, grid: Path | None = GRID, speed: bool = True) -> str:
    torch.manual_seed(0)
    config = FaceDeidConfig()
    tools = load_tools(config)
    real, _ = real_tables(config, tools, grid)
    n_ids = 50 if quick else 200
    generated, _ = generated_tables(config, tools, n_ids)
    parts = [
        "## Faces (face-deid against the re-identification attack, `python -m benchmarks "
        "--only faces`)",
        "",
        "Three recognisers, each with its own detection and alignment: dlib (CenterFace + 68 "
        "landmarks + ResNet descriptor, same person below 0.6), SFace (YuNet + alignCrop, cosine "
        "0.363, i.e. distance below 0.637) and FaceNet (YuNet + 5-point alignment, Euclidean below "
        "1.04). face-deid searches against SFace and FaceNet; dlib is held out. Rank-1 p: "
        "one-sided binomial test against chance (the audit fails a release below 0.05). Realism "
        "by YuNet (independent of all three): the share of faces it finds at IoU >= 0.5 and "
        "confidence >= 0.8, its 5 landmarks' mean shift (inter-ocular distances) and KID (x 1e3) "
        "of FaceNet features against the original crops. Default face-deid settings "
        "(`FaceDeidConfig()`).",
        "",
        "### Real identities (9 faces of 9 people in 4 photographs shipped with scikit-image, "
        "matplotlib and insightface)",
        "",
        real,
        "",
        f"### Generated identities ({n_ids} DCGAN faces, two views each; not real people; the "
        "attacker's gallery holds the other view)",
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
