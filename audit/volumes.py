"""The checks of a head-volume release (deface, reface): computed first (`compare`,
`reidentify`), judged after (`run_volume_audit`), so benchmarks reuse the computation.

The audit does not trust the mechanism's own masks. It registers another template, Colin27 (the
brain atlas of `synth.tools.mri.atlas`), to each *original* volume and checks, with that independent
brain and face:

- expectations (Great Expectations over one row per released volume): as many volumes as
  planned, same grid, type and scaling as the original, **every brain voxel bit-for-bit the
  original's**, the face region's detail no longer correlated with the original's (Pearson
  correlation of intensity minus its 2 mm Gaussian blur, the identity-bearing part; the plain
  correlation, ~0.8 between any two aligned faces, is reported beside it), no free-text header
  field or extension left in the released file, no released volume an exact copy of a sensitive
  one (HMAC);
- renders: a face-surface render of every original and released volume, kept in the report (a
  before/after grid PNG) for a person to look at;
- re-identification, two attackers: (1) each released volume's face render (pose and size
  normalised into Colin27's space through the original's registration, a frontal depth map of
  the face window) is matched to the most similar original render; (2) where voxels are fine
  enough for a face to show (at most RECOGNISER_MAX_MM), every face recogniser of
  synth.tools.face_recognisers (dlib, SFace, FaceNet, each with its own detector and alignment) is
  run
  on a shaded frontal render of every original and released head, as an attacker with renders and
  photo-trained recognisers would; a released render in which it finds no face cannot be named by
  it. The release fails when the depth-map matcher's rank-1 matches are significantly above chance
  (one-sided binomial test at `volume_reid_alpha`) or any recogniser's are (at the policy's
  `face_rank1_alpha`, 0.05 when the policy has none), and when a recogniser finds a face in fewer
  than two original renders: an attack that cannot see the faces it should protect proves nothing,
  so it fails instead of passing. A similarity of depth maps is weaker than a trained recogniser,
  and a recogniser trained on photographs is not one trained on renders, so a pass is evidence,
  not proof;
- registration: the audit's own fit of Colin27 to each original is judged like the mechanism's
  (`synth.tools.mri.registration.check_fit`): a head that fits best turned against its header, or a
  poor fit, fails the release (its brain and face would be looked for in the wrong place).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import overload

import numpy as np
from scipy import ndimage

from accounting.errors import DataFormatError, InvalidParameterError
from accounting.fingerprint import volume_record_fingerprints
from audit.checks import _cannot_run, _guard
from audit.face_policy import FacePolicy
from audit.images import sample_idx
from audit.items import here
from audit.policy import AuditPolicy
from audit.report import AuditReport, CheckResult
from audit.volume_policy import VolumePolicy
from synth.kinds.nifti import header_text
from synth.kinds.volume import Record, Volume, VolumeDataset, open_record
from synth.progress import ProgressFn
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr
from synth.tools.mri.atlas import Atlas, SubjectMasks, atlases
from synth.tools.mri.registration import Registration, check_fit
from synth.tools.mri.render import (
    Grid,
    depth_map,
    head_level,
    on_grid,
    picture,
    picture_grid,
    surface_in,
)

DETAIL_MM = 2.0  # the face's detail: intensity minus its Gaussian blur at this sigma
RENDER_MM = 2.0
GRID_SUBJECTS = 8  # subjects shown in the before/after render grid
# the recogniser's renders: 1 mm pixels, 256 of them (a whole head); voxels coarser than 3 mm
# render no eyes, nose or mouth a recogniser could read, so it is not run on them
RECOGNISER_MAX_MM = 3.0
RECOGNISER_SIDE, RECOGNISER_PIXEL_MM = 256, 1.0
CHECK_REID = "volume_reidentification"
CHECK_RENDERS = "volume_face_renders"
CHECK_REGISTRATION = "volume_registration"
RECOGNISERS = (
    "dlib",
    "sface",
    "facenet",
)  # synth.tools.face_recognisers: the attackers of the renders


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; 0 when either side is constant (nothing of one is in the other)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size < 2 or a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def detail(values: np.ndarray, zooms: tuple[float, float, float]) -> np.ndarray:
    return values - ndimage.gaussian_filter(values, [DETAIL_MM / z for z in zooms])


@dataclass(frozen=True)
class Comparison:
    """One released volume against its original, in the audit's own brain and face."""

    id: str
    geometry_ok: bool  # same grid (shape, affine), stored type and scaling
    brain_voxels: int
    brain_voxels_changed: int
    face_voxels: int
    face_voxels_changed: int
    face_correlation: float  # of the face's detail (gated)
    face_correlation_plain: float  # of the intensities (reported)
    header_text_fields: int
    header_fields: str


def _geometry_ok(a: Volume, b: Volume) -> bool:
    """Same grid, stored type and scaling, compared as geometry: the stored type by kind and size,
    not byte order (a big-endian input is released little-endian, with the same values)."""
    da, db = a.data.dtype, b.data.dtype
    return bool(
        a.shape == b.shape
        and (da.kind, da.itemsize) == (db.kind, db.itemsize)
        and np.allclose(a.affine, b.affine, atol=1e-3)
        and np.isclose(a.slope, b.slope)
        and np.isclose(a.inter, b.inter)
    )


def compare(
    rid: str, original: Volume, released: Volume, masks: SubjectMasks, file: Path | None
) -> Comparison:
    ok = _geometry_ok(original, released)
    brain, face = masks.brain, masks.face
    if ok:
        changed = int((released.data[brain] != original.data[brain]).sum())
        face_changed = int((released.data[face] != original.data[face]).sum())
        x, y = original.physical(), released.physical()
        plain = correlation(x[face], y[face])
        fine = correlation(detail(x, original.zooms)[face], detail(y, original.zooms)[face])
    else:  # another grid: nothing can be compared voxel by voxel, count the brain as changed
        changed, face_changed, plain, fine = int(brain.sum()), int(face.sum()), 1.0, 1.0
    fields = header_text(file) if file is not None else {}
    return Comparison(
        rid,
        ok,
        int(brain.sum()),
        changed,
        int(face.sum()),
        face_changed,
        fine,
        plain,
        len(fields),
        ", ".join(sorted(fields)),
    )


@dataclass(frozen=True)
class Reidentification:
    matches: list[int]  # for each released volume, the original its render matched best
    similarity: np.ndarray  # (released, original) correlations of the face depth maps
    rank1: float
    chance: float
    p_value: float


def face_window(atlas: Atlas) -> Grid:
    """The world box (the atlas's space) in which renders are compared: the atlas face's extent
    across (R, S), from well in front of it to behind it (A)."""
    idx = np.argwhere(atlas.face)
    pts = atlas.head.affine[:3, :3] @ idx.T + atlas.head.affine[:3, 3:4]
    lo, hi = pts.min(1), pts.max(1)
    return Grid(
        (float(lo[0] - 5), float(lo[1] - 20), float(lo[2] - 5)),
        (float(hi[0] + 5), float(hi[1] + 40), float(hi[2] + 5)),
        RENDER_MM,
    )


def normalised_depth(volume: Volume, reg: Registration, window: Grid, level: float) -> np.ndarray:
    """The face's frontal depth map in the atlas's space (pose and size taken out); NaN where a
    ray meets nothing."""
    return depth_map(on_grid(volume, window, transform=reg.transform.GetInverse()), level)


def face_region(atlas: Atlas, window: Grid) -> np.ndarray:
    """The atlas's face on the render window's grid (bool, (R, A, S))."""
    return on_grid(atlas.head, window, values=atlas.face.astype(np.float32)) >= 0.5


def reidentify(
    originals: list[np.ndarray], released: list[np.ndarray], faces: list[np.ndarray]
) -> Reidentification:
    """Rank-1 matching of released depth maps among the originals' (Pearson correlation over
    each original's face pixels `faces[j]`; rays that meet nothing count as the far end)."""
    from scipy.stats import binomtest

    far = float(max(np.nanmax(d) if np.isfinite(d).any() else 0.0 for d in originals)) + 1.0
    o = [np.nan_to_num(d, nan=far) for d in originals]
    r = [np.nan_to_num(d, nan=far) for d in released]
    sim = np.array([[correlation(a[m], b[m]) for b, m in zip(o, faces, strict=True)] for a in r])
    matches = [int(np.argmax(row)) for row in sim]
    n = len(matches)
    hits = sum(int(m == i) for i, m in enumerate(matches))
    chance = 1.0 / n
    p = float(binomtest(hits, n, chance, alternative="greater").pvalue)
    return Reidentification(matches, sim, hits / n, chance, p)


@dataclass(frozen=True)
class Recognition:
    """A face recogniser's rank-1 identification of released renders among the originals'."""

    recogniser: str  # its key in synth.tools.face_recognisers
    name: str
    subjects: int
    originals_with_face: int  # the gallery: original renders in which a face was found
    released_with_face: int
    hits: int  # released faces whose nearest gallery face is their own subject's
    rank1: float  # hits over the gallery's subjects
    chance: float
    p_value: float
    matches: list[int | None]  # per released volume: the original it was named as, if any


def recognise(
    originals: list[np.ndarray], released: list[np.ndarray], recogniser: fr.Recogniser
) -> Recognition | None:
    """Rank-1 identification with a face recogniser (its own detection and alignment): each
    released render's largest face against the largest face of every original render (nearest by
    the recogniser's distance). A subject whose released render shows no face counts as not named;
    chance is one over the gallery's size. None when fewer than two original renders show a face
    (there is nothing to choose among; the audit fails then, it cannot see the faces). Only the
    ranking is used: the recognisers' same-person distances were set on photographs, and renders
    of different heads fall within them of one another."""
    from scipy.stats import binomtest

    def largest(picture_: np.ndarray) -> np.ndarray | None:
        found = recogniser.sightings(fm.as_rgb(picture_))
        return found[0].embedding if found else None

    gallery = {j: e for j, p in enumerate(originals) if (e := largest(p)) is not None}
    if len(gallery) < 2:
        return None
    ids = np.array(list(gallery))
    g = np.stack([gallery[j] for j in ids])
    matches: list[int | None] = []
    found = 0
    for p in released:
        e = largest(p)
        if e is None:
            matches.append(None)
            continue
        found += 1
        d = recogniser.distances(g, e[None, :])
        matches.append(int(ids[int(np.argmin(d))]))
    trials = len(gallery)  # subjects a recogniser could name: those with a face in the gallery
    hits = sum(int(m == i) for i, m in enumerate(matches) if i in gallery)
    chance = 1.0 / len(gallery)
    return Recognition(
        recogniser=recogniser.key,
        name=recogniser.name,
        subjects=len(released),
        originals_with_face=len(gallery),
        released_with_face=found,
        hits=hits,
        rank1=hits / trials,
        chance=chance,
        p_value=float(binomtest(hits, trials, chance, alternative="greater").pvalue),
        matches=matches,
    )


def canonical_bytes(volume: Volume) -> bytes:
    """`volume.stored_bytes()` in little-endian order: a byte-swapped copy is still a copy."""
    dtype = volume.data.dtype
    if dtype.newbyteorder("<") != dtype:
        volume = Volume(
            volume.data.astype(dtype.newbyteorder("<")),
            volume.affine,
            volume.slope,
            volume.inter,
            volume.name,
        )
    return volume.stored_bytes()


def _registration_check(problems: list[str], metrics: list[float]) -> CheckResult:
    return CheckResult(
        CHECK_REGISTRATION,
        "expectations",
        not problems,
        (
            f"Colin27 registered to every original in its header's orientation (metrics "
            f"{min(metrics):.3f}..{max(metrics):.3f})"
            if not problems
            else f"{len(problems)} of {len(metrics)} originals cannot be registered in their "
            "header's orientation, so their brain and face cannot be checked: "
            + "; ".join(problems)
        ),
        {"metrics": [round(m, 4) for m in metrics], "problems": problems},
    )


def recogniser_picture(volume: Volume) -> np.ndarray:
    """The shaded frontal render the recogniser looks at (1 mm pixels, the whole head)."""
    return picture(volume, RECOGNISER_SIDE, RECOGNISER_PIXEL_MM)


def _expectations(rows: list[Comparison], inputs, policy: AuditPolicy, hmacs) -> list[CheckResult]:
    import pandas as pd

    from audit.expectations import validate_table

    table = pd.DataFrame([r.__dict__ for r in rows])
    released = inputs.released
    table["sha256"] = volume_record_fingerprints(
        inputs.record_fingerprint_key, (canonical_bytes(v) for v in released.volumes)
    )  # one volume read at a time
    import great_expectations.expectations as gxe

    exps = [
        gxe.ExpectTableRowCountToEqual(value=int(inputs.expected_count)),
        gxe.ExpectColumnValuesToBeUnique(column="id"),
        gxe.ExpectColumnValuesToBeInSet(column="geometry_ok", value_set=[True]),
        gxe.ExpectColumnValuesToBeBetween(column="brain_voxels_changed", min_value=0, max_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="header_text_fields", min_value=0, max_value=0),
        gxe.ExpectColumnValuesToNotBeInSet(column="sha256", value_set=list(hmacs)),
        gxe.ExpectColumnValuesToBeBetween(column="face_voxels_changed", min_value=1),
        gxe.ExpectColumnValuesToNotBeNull(column="face_correlation"),
    ]
    limit = policy.section(VolumePolicy).volume_max_face_correlation
    if limit is not None:
        exps.append(
            gxe.ExpectColumnValuesToBeBetween(column="face_correlation", max_value=float(limit))
        )
    out = validate_table(table, exps)
    for r in out:  # the figures behind each verdict, per volume
        r.details["per_volume"] = [
            {
                k: getattr(c, k)
                for k in (
                    "id",
                    "brain_voxels_changed",
                    "face_correlation",
                    "face_correlation_plain",
                    "header_fields",
                )
            }
            for c in rows
        ]
    return out


def _renders(inputs, art: Path | None) -> CheckResult:
    # the first GRID_SUBJECTS pairs only, one pair read at a time (volumes held by reference)
    n = len(inputs.released)
    shown = [
        (picture(inputs.sensitive[i]), picture(inputs.released[i]))
        for i in range(min(GRID_SUBJECTS, n))
    ]
    grid = picture_grid([[o for o, _ in shown], [r for _, r in shown]])
    artifacts = {}
    if art is not None:
        from PIL import Image

        art.mkdir(parents=True, exist_ok=True)
        path = art / "volume_face_renders.png"
        Image.fromarray(grid).save(path)
        artifacts["before_after_grid"] = str(path)
    return CheckResult(
        CHECK_RENDERS,
        "fidelity",
        None,
        f"face-surface renders of {len(shown)} of {n} volumes, originals (top) and "
        "released (bottom): look at them",
        {"subjects_shown": len(shown)},
        artifacts,
    )


def run_volume_audit(inputs, policy: AuditPolicy, progress: ProgressFn) -> AuditReport:
    """Every check of a volume release (module docstring), into one report."""
    released: VolumeDataset = inputs.released
    originals = inputs.sensitive
    report = AuditReport(inputs.release_id)
    if not isinstance(originals, VolumeDataset) or len(originals) != len(released):
        report.results.append(_mismatch(released, originals))
        return report
    art = Path(inputs.artifacts_dir) if inputs.artifacts_dir is not None else None
    # one record per subject (a BIDS subject's sessions and contrasts are one person): the
    # re-identification's probes and gallery, and what its minimum counts
    subjects = originals.subject_heads()
    drawn = reid_subjects(subjects, policy)
    scan = _scan_subjects(inputs, originals, released, progress, drawn)
    hmacs = volume_record_fingerprints(
        inputs.record_fingerprint_key, (canonical_bytes(v) for v in originals.volumes)
    )  # one volume read at a time
    report.results.append(_registration_check(scan.problems, scan.metrics))
    report.results += _guard(
        "volume_expectations",
        "expectations",
        lambda: _expectations(scan.rows, inputs, policy, hmacs),
    )
    report.results += _guard(CHECK_RENDERS, "fidelity", lambda: _renders(inputs, art))
    report.results += _reid_results(scan, len(subjects), policy)
    from audit.bids_validation import bids_check

    bids = bids_check(list(inputs.released_files or []), art)
    if bids is not None:
        report.results.append(bids)
    return report


def reid_subjects(subjects: int | Sequence[int], policy: AuditPolicy) -> set[int]:
    """The records the re-identification attacks (probes and gallery): one per subject (`subjects`,
    their indices; an int n: records 0..n-1, each its own subject), all of them or
    `volume_reid_samples` drawn with the policy's seed."""
    heads = list(range(subjects)) if isinstance(subjects, int) else list(subjects)
    samples = policy.section(VolumePolicy).volume_reid_samples
    picked = sample_idx(len(heads), samples, np.random.default_rng(policy.seed))
    return {int(heads[int(i)]) for i in picked}


def _mismatch(released: VolumeDataset, originals: object) -> CheckResult:
    """The failed readability check of a release whose volumes do not match its dataset's."""
    return CheckResult(
        "release_readable",
        "expectations",
        False,
        f"{len(released)} released volumes for "
        f"{len(originals) if isinstance(originals, VolumeDataset) else 'no'} original "
        "volumes: the release does not match its dataset",
        {},
    )


@dataclass
class _SubjectScan:
    """Per subject, what the checks compare: registration, comparison rows, face depth maps and
    pixels, and recogniser pictures."""

    rows: list[Comparison] = field(default_factory=list)
    depth_o: list[np.ndarray] = field(default_factory=list)
    depth_r: list[np.ndarray] = field(default_factory=list)
    face_px: list[np.ndarray] = field(default_factory=list)
    pics_o: list[np.ndarray] = field(default_factory=list)
    pics_r: list[np.ndarray] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)
    drawn: list[int] = field(default_factory=list)  # the subjects of the depth maps and pictures


def _scan_subjects(
    inputs,
    originals: VolumeDataset,
    released: VolumeDataset,
    progress: ProgressFn,
    drawn: set[int],
) -> _SubjectScan:
    """Register each original to the atlas and gather what the checks compare, one subject an
    item (`scan_subject`, mapped by `inputs.map_items`: here, or on the run's workers); the
    released files' headers are read here, where they were written. Depth maps and pictures are
    kept for the `drawn` subjects only (the re-identification's)."""
    files = inputs.released_files or [None] * len(released)
    _brain_atlas(inputs.cache_dir)  # built (and cached) here once, before any worker reads it
    items = _Subjects(inputs.ids, originals, released)
    job = SubjectJob(inputs.cache_dir)
    map_items = inputs.map_items or here(progress)
    scanned = map_items(scan_subject, job, items, label=SUBJECTS_STAGE, keep=False)
    scan = _SubjectScan()
    for i, (one, file) in enumerate(zip(scanned, files, strict=True)):
        scan.metrics.append(one.metric)
        if one.problem is not None:
            scan.problems.append(one.problem)
        scan.rows.append(_with_header(one.row, file))
        if i not in drawn:
            continue
        scan.drawn.append(i)
        scan.depth_o.append(one.depth_o)
        scan.depth_r.append(one.depth_r)
        scan.face_px.append(one.face_px)
        if one.pictures is not None:
            scan.pics_o.append(one.pictures[0])
            scan.pics_r.append(one.pictures[1])
    return scan


SUBJECTS_STAGE = "audit: volumes (subjects)"


class _Subjects(Sequence[tuple[str, Record, Volume]]):
    """The audit's items, built when each is handed out (a few at a time, not all at once):
    subject i's id, its original's record (a reference when the dataset is held by reference: the
    worker reads the head from shared storage and checks its digest, as deface's do) and its
    released volume (read here, where the release was written: the workers read no release)."""

    def __init__(self, ids: Sequence[str], originals: VolumeDataset, released: VolumeDataset):
        self.ids, self.originals, self.released = ids, originals.records, released

    def __len__(self) -> int:
        return len(self.released)

    @overload
    def __getitem__(self, i: int) -> tuple[str, Record, Volume]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[str, Record, Volume]]: ...
    def __getitem__(
        self, i: int | slice
    ) -> tuple[str, Record, Volume] | Sequence[tuple[str, Record, Volume]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.ids[i], self.originals[i], self.released[i]


@dataclass(frozen=True)
class SubjectJob:
    """What a worker needs to scan a subject: where the public atlases are cached."""

    cache_dir: Path | None


@dataclass(frozen=True)
class SubjectScan:
    """One subject's registration (metric, why its fit fails), comparison row (no header yet),
    face depth maps and pixels, and recogniser pictures (None: voxels too coarse)."""

    metric: float
    problem: str | None
    row: Comparison
    depth_o: np.ndarray
    depth_r: np.ndarray
    face_px: np.ndarray
    pictures: tuple[np.ndarray, np.ndarray] | None


@lru_cache(maxsize=2)
def _brain_atlas(cache_dir: Path | None) -> tuple[Atlas, Grid, np.ndarray]:
    """Colin27, the render window and its face on it, once per process."""
    _, brain_atlas = atlases(cache_dir)
    window = face_window(brain_atlas)
    return brain_atlas, window, face_region(brain_atlas, window)


def scan_subject(job: SubjectJob, item: tuple[str, Record, Volume]) -> SubjectScan:
    """One subject (id, original or its reference, released): the audit's per-item function
    (module-level, so that a Dask worker can run it)."""
    rid, record, rel = item
    orig = open_record(record)
    brain_atlas, window, face = _brain_atlas(job.cache_dir)
    reg = brain_atlas.register(orig)
    problem = None
    try:
        check_fit(reg, rid)
    except DataFormatError as exc:
        problem = str(exc)
    masks = brain_atlas.on(orig, reg)
    level = head_level(orig.physical())
    depth_o = normalised_depth(orig, reg, window, level)
    return SubjectScan(
        reg.metric,
        problem,
        compare(rid, orig, rel, masks, None),
        depth_o,
        normalised_depth(rel, reg, window, level),
        # the pixels showing the face: what a face recogniser looks at (not the ears, the scalp
        # or the outline of the skull)
        surface_in(face, depth_o),
        (recogniser_picture(orig), recogniser_picture(rel))
        if max(orig.zooms) <= RECOGNISER_MAX_MM
        else None,
    )


def _with_header(row: Comparison, file: Path | None) -> Comparison:
    """The row with the released file's header text fields (none without a file)."""
    fields = header_text(file) if file is not None else {}
    return replace(row, header_text_fields=len(fields), header_fields=", ".join(sorted(fields)))


def _reid_results(scan: _SubjectScan, n: int, policy: AuditPolicy) -> list[CheckResult]:
    """The re-identification check, or why it cannot run with too few subjects."""
    least = policy.section(VolumePolicy).volume_min_subjects
    if len(scan.drawn) < least:
        return [
            _cannot_run(
                CHECK_REID,
                "attack",
                f"{n} subjects; the re-identification test needs at least "
                f"{least} to tell a match from chance",
                policy,
            )
        ]
    return _guard(
        CHECK_REID,
        "attack",
        lambda: _judge_reid(
            scan.depth_o,
            scan.depth_r,
            scan.face_px,
            policy,
            scan.pics_o,
            scan.pics_r,
            scan.drawn,
            n,
        ),
    )


def _judge_reid(
    depth_o,
    depth_r,
    face_px,
    policy: AuditPolicy,
    pics_o: list[np.ndarray],
    pics_r: list[np.ndarray],
    drawn: list[int] | None = None,
    of: int | None = None,
) -> CheckResult:
    """The re-identification among the `drawn` subjects of `of` (matches are indices into
    `drawn`; by default every subject was drawn)."""
    r = reidentify(depth_o, depth_r, face_px)
    n = len(r.matches)
    drawn = list(range(n)) if drawn is None else drawn
    of = n if of is None else of
    hits = round(r.rank1 * n)
    # the recognisers' rank-1 level is the face attacks' (audit/face_policy.py)
    level = policy.section(FacePolicy).face_rank1_alpha
    if level is None:
        raise InvalidParameterError(
            "audit policy face_rank1_alpha is unset; the recognisers of the face renders need a "
            "level at least 0 and below 1 (0: informational)."
        )
    alpha = float(level)
    recs: dict[str, Recognition | None] = {}
    why_not = None
    if len(pics_o) == n:
        recs = {k: recognise(pics_o, pics_r, fr.recogniser(k)) for k in RECOGNISERS}
    else:
        why_not = f"voxels coarser than {RECOGNISER_MAX_MM:g} mm"
    blind = [k for k, rec in recs.items() if rec is None]
    named = [k for k, rec in recs.items() if rec is not None and rec.p_value < alpha]
    level = policy.section(VolumePolicy).volume_reid_alpha
    passed = r.p_value >= level and not blind and not named
    recognisers = _recognisers_line(recs, n, alpha, why_not)
    sampled = f" ({n} subjects drawn of {of})" if n < of else ""
    return CheckResult(
        CHECK_REID,
        "attack",
        passed,
        f"rank-1 re-identification of face renders: depth-map matcher {hits}/{n} = "
        f"{r.rank1:.2f} (chance {r.chance:.2f}, one-sided binomial p = {r.p_value:.3g}, fails "
        f"below p = {level:g}){sampled}; {recognisers}",
        {
            "rank1": r.rank1,
            "hits": hits,
            "subjects": n,
            "of_subjects": of,
            "drawn_subjects": drawn if n < of else None,
            "chance": r.chance,
            "p_value": r.p_value,
            "matches": r.matches,
            "matcher": "Pearson correlation of frontal depth maps over the face, in Colin27 space",
            "recognisers": {k: None if rec is None else rec.__dict__ for k, rec in recs.items()},
            "recognisers_blind": blind,
            "recognisers_named": named,
            "face_rank1_alpha": alpha,
            "recogniser_not_run": why_not,
        },
    )


def _recognisers_line(
    recs: dict[str, Recognition | None], n: int, alpha: float, why_not: str | None
) -> str:
    """What each face recogniser made of the renders (a blind one is a failure), or why none
    ran."""
    said = []
    for k, rec in recs.items():
        if rec is None:
            said.append(
                f"{k} FOUND NO FACE in two or more original renders (the attack cannot see the "
                "faces it must protect: a failure, not a pass)"
            )
        else:
            said.append(
                f"{k} {rec.hits}/{rec.originals_with_face} (chance {rec.chance:.2f}, p = "
                f"{rec.p_value:.3g}; a face found in {rec.released_with_face}/{n} released renders)"
            )
    return (
        "face recognisers: " + "; ".join(said) + f"; each fails below p = {alpha:g}"
        if recs
        else f"face recognisers not run ({why_not})"
    )
