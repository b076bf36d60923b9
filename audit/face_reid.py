"""Face re-identification attack: can face recognisers tell who is in the released images?

Every release is attacked by every recogniser of the policy (`face_recognisers`; synth.
face_recognisers: dlib, SFace, FaceNet), each as an attacker runs it: its own detector, alignment
and embedding on the released photo and on the sensitive originals. A mechanism that searched
against one recogniser cannot pass by fooling that one alone: the others are held out.

- **Paired** (each released image names its source records: face de-identification, one source
  per photo; k-anonymous releases, k sources per average): genuine pairs are a released face and
  the matching face of a source (the same place in the photo, or the largest face of each image
  when they differ in framing). Where the recogniser's detector misses a face at an original's
  place, it is asked about that place (`at`); a face it cannot find even there counts as neither
  verified nor identified. Verification: the true-accept rate (TAR) at the recogniser's published
  threshold and at the thresholds where its false-accept rate (FAR) on real faces (pairs of
  different original faces: the operating point an attacker sets before seeing the release) is
  1e-3 and 1e-2. Identification: the rank-1 rate of each released face against the gallery of
  original faces (hit = the nearest original face is one it replaced or averaged), its chance rate,
  and a one-sided binomial test of the hits against the mean chance rate.
- **Unpaired** (synthetic releases, e.g. PrivImage): per recogniser, the share of released faces
  within its threshold of some training face, against the same share for held-out faces.
- **Realism** (paired releases whose faces stay in place: face-deid): the share of the original
  faces YuNet finds (confidence >= 0.8) that it still finds in the released photo (IoU >= 0.5), the
  displacement of YuNet's 5 landmarks (inter-ocular distances; dlib's 68 as well), and the kernel
  inception distance (KID) of FaceNet features of released against original face crops, beside the
  KID of the originals blurred and pixelated.

Impostor pairs assume that different faces of the original photos are different people; where one
person has several records, their pairs count as impostors and the FAR-based thresholds come out
lower (the fixed-threshold TAR is unaffected). With fewer than 1/FAR impostor pairs, the threshold
at that FAR is the closest impostor pair's distance (`far_resolution` in the details).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.checks import _cannot_run, _guard
from audit.face_policy import FacePolicy
from audit.images import sample_idx
from audit.items import MapItems, in_process
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr

if TYPE_CHECKING:
    from audit.inputs import AuditInputs

CHECK = "face_reidentification"  # one check per recogniser: face_reidentification[KEY]
GEOMETRY_CHECK = "face_geometry"
RETENTION_CHECK = "face_detection_retention"
KID_CHECK = "face_kid"
SHARPNESS_CHECK = "face_sharpness"
SHARPNESS_RANGE = (0.8, 1.25)  # a released face's sharpness ratio a steward would not notice
SIGHTINGS_STAGE = "audit: faces (images)"  # the progress bar over the images the attack reads
REALISM_STAGE = "audit: faces (realism)"  # and over the photos the realism checks compare
FARS = (1e-3, 1e-2)
MIN_FACE_IMAGE = 32  # smaller images (digits) are never probed: no recognisable face fits
SAME_PLACE_IOU = 0.3  # a released face this close to an original face's box is its replacement
RETENTION_IOU = 0.5  # YuNet must find a replaced face this close to the original's box
BLUR_SIGMA = 8.0  # the blurred baseline of the KID check (pixels)
PIXEL_BLOCKS = 8  # the pixelated baseline: blocks across the face box


def check_name(key: str) -> str:
    """The name of one recogniser's re-identification check (a row of the report and card)."""
    return f"{CHECK}[{key}]"


# ------------------------------------------------------------------ recognisers
def as_recogniser(attacker: fr.Recogniser | fm.Embedder) -> fr.Recogniser:
    """A recogniser as it is, or an embedder behind dlib's detection and landmarks."""
    if hasattr(attacker, "sightings"):
        return attacker  # type: ignore[return-value]
    if isinstance(attacker, fm.DlibEmbedder):
        return fr.recogniser("dlib")
    return fr.EmbedderRecogniser(attacker, attacker.name)


def policy_recognisers(policy: AuditPolicy) -> list[fr.Recogniser]:
    """The recognisers the policy attacks with: `face_recognisers`, plus a `face_embedder` other
    than dlib (older specs name their own embedder there)."""
    return list(job_recognisers(sightings_job(policy)))


@dataclass(frozen=True)
class SightingsJob:
    """What a worker needs to find every recogniser's faces in an image: the recognisers' keys
    (synth.face_recognisers) and an own embedder's name (None: none beside them)."""

    recognisers: tuple[str, ...]
    embedder: str | None = None


def sightings_job(policy: AuditPolicy) -> SightingsJob:
    """The policy's recognisers as a worker builds them (`policy_recognisers`)."""
    faces = policy.section(FacePolicy)
    own = faces.face_embedder
    extra = own if own != "dlib" and own not in faces.face_recognisers else None
    return SightingsJob(tuple(faces.face_recognisers), extra)


@lru_cache(maxsize=4)
def job_recognisers(job: SightingsJob) -> tuple[fr.Recogniser, ...]:
    """The job's recognisers, built once per process (their models load once)."""
    recs = [fr.recogniser(k) for k in job.recognisers]
    if job.embedder is not None:
        recs.append(fr.EmbedderRecogniser(fm.embedder(job.embedder), job.embedder))
    return tuple(recs)


def image_sightings(job: SightingsJob, image: np.ndarray) -> list[list[fr.Sighting]]:
    """Every recogniser's faces in one image (the audit's per-item function, mapped over the
    attacked and gallery images: module-level, so that a Dask worker can run it)."""
    return [sightings_of(rec, image) for rec in job_recognisers(job)]


def sightings_of(rec: fr.Recogniser, image: np.ndarray) -> list[fr.Sighting]:
    """One recogniser's faces in an image; in a small image where it finds none, the face the
    alignment template puts there (`_framed_sighting`)."""
    faces = rec.sightings(image)
    if not faces and max(image.shape[:2]) <= fm.SMALL_IMAGE:
        framed = _framed_sighting(rec, image)
        faces = [] if framed is None else [framed]
    return faces


def _uses_dlib_landmarks(rec: fr.Recogniser) -> bool:
    return isinstance(rec, fr.EmbedderRecogniser)  # dlib's too


def _framed_sighting(rec: fr.Recogniser, image: np.ndarray) -> fr.Sighting | None:
    """A small image (an aligned crop, an average of crops) in which the detector finds no face,
    taken as one face where the alignment template puts it: an attacker who knows the images are
    aligned faces does not need a detector."""
    h, w = image.shape[:2]
    points = fm.TEMPLATE_112 * np.array([w / 112.0, h / 112.0])
    cx, cy = points[:, 0].mean(), points[:, 1].mean()
    side = 1.9 * (
        points[1, 0] - points[0, 0]
    )  # about the box dlib's detector draws for such a face
    box = (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
    embed_row = getattr(rec, "embed_row", None)
    if embed_row is None:  # dlib's pipeline: landmarks predicted in the template's box
        return rec.at(image, box)
    # YuNet-based: the template's points in YuNet's row layout (x, y, w, h, 5 points, score)
    row = np.concatenate([[box[0], box[1], side, side], points.ravel(), [0.0]])
    return fr.Sighting(box, 0.0, points, embed_row(fm.as_rgb(image), row))


@dataclass
class SightingIndex:
    """One recogniser's sightings per image, computed once per audit."""

    recogniser: fr.Recogniser
    found: dict[tuple[str, int], list[fr.Sighting]] = field(default_factory=dict)

    def of(self, tag: str, i: int, image: np.ndarray) -> list[fr.Sighting]:
        key = (tag, int(i))
        if key not in self.found:
            self.found[key] = sightings_of(self.recogniser, image)
        return self.found[key]


@dataclass
class FaceIndex:
    """Detected faces and their embeddings with a `synth.tools.face_models` embedder, per image (the
    benchmarks' identity tables use it)."""

    embedder: fm.Embedder
    faces: dict[tuple[str, int], list[tuple[fm.Face, np.ndarray]]] = field(default_factory=dict)

    def of(self, tag: str, i: int, image: np.ndarray) -> list[tuple[fm.Face, np.ndarray]]:
        key = (tag, int(i))
        if key not in self.faces:
            faces = fm.detect(image)
            if not faces and max(image.shape[:2]) <= fm.SMALL_IMAGE:
                faces = [fm.aligned_face(image)]
            self.faces[key] = [(f, self.embedder.embed(image, f)) for f in faces]
        return self.faces[key]


# ------------------------------------------------------------------ statistics
def threshold_at_far(impostor: np.ndarray, far: float) -> tuple[float, float]:
    """(threshold, achieved FAR): the largest distance threshold (accept when distance < it) whose
    FAR on the impostor pairs is at most `far`."""
    d = np.sort(np.asarray(impostor, dtype=np.float64))
    if len(d) == 0:
        return float("nan"), float("nan")
    allowed = int(np.floor(far * len(d)))  # false accepts we may afford
    threshold = float(d[allowed]) if allowed < len(d) else float("inf")
    return threshold, float(np.mean(d < threshold))


def verification(genuine: np.ndarray, impostor: np.ndarray, threshold: float) -> dict[str, Any]:
    """TAR/FAR at the recogniser's threshold, and TAR at each FAR of FARS with the threshold set on
    the `impostor` pairs. A genuine distance of infinity is a face the recogniser never found."""
    genuine, impostor = np.asarray(genuine, float), np.asarray(impostor, float)
    seen = genuine[np.isfinite(genuine)]
    out: dict[str, Any] = {
        "threshold": threshold,
        "tar_at_threshold": float(np.mean(genuine < threshold)) if len(genuine) else None,
        "far_at_threshold": float(np.mean(impostor < threshold)) if len(impostor) else None,
        "n_genuine": len(genuine),
        "n_impostor": len(impostor),
        "far_resolution": 1.0 / len(impostor) if len(impostor) else None,
        "median_genuine_distance": float(np.median(seen)) if len(seen) else None,
        "median_impostor_distance": float(np.median(impostor)) if len(impostor) else None,
    }
    for far in FARS:
        thr, achieved = threshold_at_far(impostor, far)
        out[f"tar_at_far_{far:g}"] = (
            float(np.mean(genuine < thr)) if len(genuine) and np.isfinite(thr) else None
        )
        out[f"threshold_at_far_{far:g}"] = thr if np.isfinite(thr) else None
        out[f"achieved_far_{far:g}"] = achieved if np.isfinite(achieved) else None
    return out


def rank1_p_value(hits: int, trials: int, chance: float) -> float | None:
    """One-sided binomial test: the probability of at least `hits` rank-1 hits in `trials` if each
    were a guess succeeding with probability `chance` (None without trials)."""
    if trials == 0:
        return None
    from scipy.stats import binomtest

    return float(binomtest(hits, trials, min(max(chance, 0.0), 1.0), alternative="greater").pvalue)


def two_sample_auc(released: np.ndarray, original: np.ndarray) -> float | None:
    """How well a cross-validated logistic regression tells released from original face
    features apart (ROC AUC; 0.5: it cannot); None with fewer than 4 of either."""
    n = min(len(released), len(original))
    if n < 4:
        return None
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_predict

    x = np.concatenate([released, original])
    y = np.r_[np.ones(len(released)), np.zeros(len(original))]
    folds = min(5, n)
    scores = cross_val_predict(
        LogisticRegression(max_iter=1000), x, y, cv=folds, method="predict_proba"
    )[:, 1]
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, scores))


def kid(x: np.ndarray, y: np.ndarray) -> float | None:
    """Kernel inception distance (Binkowski et al. 2018): the unbiased estimate of the squared MMD
    between feature sets x and y with the kernel k(a, b) = (a.b / d + 1)^3. None when either set
    has fewer than two rows (the unbiased estimate needs pairs)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m, n = len(x), len(y)
    if m < 2 or n < 2:
        return None
    d = x.shape[1]
    kxx, kyy, kxy = ((a @ b.T / d + 1.0) ** 3 for a, b in ((x, x), (y, y), (x, y)))
    within_x = (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
    within_y = (kyy.sum() - np.trace(kyy)) / (n * (n - 1))
    return float(within_x + within_y - 2.0 * kxy.mean())


# ------------------------------------------------------------------ paired attack
def _pair_faces(
    released: Sequence[fr.Sighting], original: Sequence[fr.Sighting], same_frame: bool
) -> list[tuple[int, int, bool]]:
    """(released face, original face, same place?) pairs: by box overlap when both images share a
    frame, else the largest face of each."""
    pairs = []
    if same_frame:
        for j, of in enumerate(original):
            ious = [fm.box_iou(rf.box, of.box) for rf in released]
            if ious and max(ious) >= SAME_PLACE_IOU:
                pairs.append((int(np.argmax(ious)), j, True))
    if not pairs and released and original:
        pairs.append((0, 0, False))
    return pairs


def _same_frame(
    images: np.ndarray, r: int, sources: list[np.ndarray], sensitive: ImageDataset
) -> bool:
    """A released photo in its source's frame (face-deid): faces stay where they were."""
    return (
        images[r].shape == sensitive.images[0].shape
        and len({int(s) for s in np.asarray(sources[r]).ravel()}) == 1
    )


def paired_sample(
    n_released: int, sources: list[np.ndarray], n_sensitive: int, policy: AuditPolicy
) -> tuple[np.ndarray, list[int]]:
    """The released images attacked and the original records of the gallery (their sources, then
    others up to `face_samples`): the same for every recogniser."""
    rng = np.random.default_rng(policy.seed)
    m = policy.section(FacePolicy).face_samples
    attacked = sample_idx(n_released, m, rng)
    used = {int(s) for r in attacked for s in np.asarray(sources[r]).ravel()}
    others = np.setdiff1d(np.arange(n_sensitive), sorted(used))
    extra = others[sample_idx(len(others), max(0, m - len(used)), rng)]
    return attacked, sorted(used | {int(i) for i in extra})


@dataclass(frozen=True)
class FaceReidNumbers:
    mode: str  # "paired" | "unpaired"
    details: dict[str, Any]

    @property
    def rate(self) -> float | None:
        """The re-identification rate the policy gates: TAR at the threshold (paired), or the
        training match rate above the held-out one (unpaired)."""
        return self.details.get("reidentification_rate")

    @property
    def key(self) -> str:
        return str(self.details.get("recogniser", "dlib"))


@dataclass
class _PairedTally:
    """What the paired attack gathers over the attacked records, in the order it finds it."""

    genuine: list[float] = field(default_factory=list)
    impostor: list[float] = field(default_factory=list)
    shifts: list[float] = field(default_factory=list)
    hits: list[bool] = field(default_factory=list)
    chance: list[float] = field(default_factory=list)
    released_faces: int = 0
    unmatched: int = 0
    lost_faces: int = 0


def compute_paired(
    images: np.ndarray,
    sources: list[np.ndarray],
    sensitive: ImageDataset,
    policy: AuditPolicy,
    recogniser: fr.Recogniser | fm.Embedder,
    sightings: SightingIndex | None = None,
) -> FaceReidNumbers:
    """One recogniser's verification and rank-1 identification of released faces against their
    originals (`sightings`: the recogniser's faces already found, `map_sightings`)."""
    index = sightings if sightings is not None else SightingIndex(as_recogniser(recogniser))
    rec = index.recogniser
    attacked, gallery_ids = paired_sample(len(images), sources, len(sensitive), policy)
    gallery = [
        (g, k, s)
        for g in gallery_ids
        for k, s in enumerate(index.of("sensitive", g, sensitive.images[g]))
    ]
    where = {(g, k): n for n, (g, k, _) in enumerate(gallery)}
    g_emb = np.stack([s.embedding for *_, s in gallery]) if gallery else np.zeros((0, 1))
    tally = _PairedTally()
    for r in attacked:
        rel = list(index.of("release", r, images[r]))
        tally.released_faces += len(rel)
        targets, lost = _pair_record(r, rel, images, sources, sensitive, index, where, tally)
        _identify_record(rec, rel, targets, lost, g_emb, len(gallery), tally)
    # the recogniser's operating points, calibrated on real faces: pairs of different original faces
    first, second = np.triu_indices(len(gallery), 1)
    reference = rec.distances(g_emb[first], g_emb[second]) if len(first) else np.zeros(0)
    ver = verification(np.array(tally.genuine), reference, rec.threshold)
    details = _paired_details(rec, tally, ver, len(attacked), len(gallery_ids), len(gallery))
    return FaceReidNumbers("paired", details)


def _pair_record(
    r: int,
    rel: list[fr.Sighting],
    images: np.ndarray,
    sources: list[np.ndarray],
    sensitive: ImageDataset,
    index: SightingIndex,
    where: dict[tuple[int, int], int],
    tally: _PairedTally,
) -> tuple[dict[int, set[int]], list[int]]:
    """Pair released record `r`'s faces with its sources' faces (genuine distances, landmark
    shifts); (released face -> its original faces' gallery rows, gallery rows found nowhere)."""
    rec = index.recogniser
    same_frame = _same_frame(images, r, sources, sensitive)
    targets: dict[int, set[int]] = {}  # released face -> its original faces (gallery rows)
    lost: list[int] = []  # original faces the recogniser finds nowhere in the release
    for s in sorted({int(s) for s in np.asarray(sources[r]).ravel()}):
        orig = index.of("sensitive", s, sensitive.images[s])
        pairs = _pair_faces(rel, orig, same_frame)
        missed = sorted(set(range(len(orig))) - {j for _, j, _ in pairs})
        tally.unmatched += len(missed)
        if same_frame:  # the detector missed it: the attacker looks where the original was
            for j in missed:
                there = rec.at(images[r], orig[j].box)
                if there is None:
                    lost.append(where[(s, j)])
                    continue
                rel.append(there)
                pairs.append((len(rel) - 1, j, True))
        for a, b, same_place in pairs:
            tally.genuine.append(float(rec.distances(rel[a].embedding, orig[b].embedding)[0]))
            targets.setdefault(a, set()).add(where[(s, b)])
            if same_place and _uses_dlib_landmarks(rec):
                # dlib's 68 landmarks of both, predicted at the original's box: pose and
                # expression
                box = orig[b].box
                tally.shifts.append(
                    fm.landmark_shift(
                        fm.landmarks(sensitive.images[s], box), fm.landmarks(images[r], box)
                    )
                )
    return targets, lost


def _identify_record(
    rec: fr.Recogniser,
    rel: list[fr.Sighting],
    targets: dict[int, set[int]],
    lost: list[int],
    g_emb: np.ndarray,
    n_gallery: int,
    tally: _PairedTally,
) -> None:
    """Rank-1 identification of one record's released faces against the gallery (impostor
    distances, hits, chance); its lost original faces count as failed attempts."""
    for a, sight in enumerate(rel):
        d = rec.distances(g_emb, sight.embedding[None])
        mine = np.zeros(n_gallery, bool)
        mine[sorted(targets.get(a, set()))] = True
        tally.impostor.extend(d[~mine].tolist())
        if mine.any():
            tally.hits.append(bool(mine[int(np.argmin(d))]))
            tally.chance.append(float(mine.mean()))
    for _ in lost:  # neither verified nor identified, but an attempt all the same
        tally.lost_faces += 1
        tally.genuine.append(float("inf"))
        tally.hits.append(False)
        tally.chance.append(1.0 / n_gallery)


def _paired_details(
    rec: fr.Recogniser,
    tally: _PairedTally,
    ver: dict[str, Any],
    n_attacked: int,
    n_gallery_records: int,
    n_gallery_faces: int,
) -> dict[str, Any]:
    """The paired attack's report details, from its tally and verification numbers."""
    impostor, hits, shifts = tally.impostor, tally.hits, tally.shifts
    mean_chance = float(np.mean(tally.chance)) if tally.chance else None
    return {
        "mode": "paired",
        "recogniser": rec.key,
        "embedder": rec.name,
        "n_released_attacked": n_attacked,
        "n_released_faces": tally.released_faces,
        "n_gallery_records": n_gallery_records,
        "n_gallery_faces": n_gallery_faces,
        # not found by the detector in the release (same frame: attacked at the original's place)
        "original_faces_not_found_in_release": tally.unmatched,
        # not found even at the original's place: counted as neither verified nor identified
        "original_faces_not_found_at_their_place": tally.lost_faces,
        **ver,
        "far_calibration": "pairs of different original faces",
        "release_impostor_pairs": len(impostor),
        "release_far_at_threshold": (
            float(np.mean(np.array(impostor) < rec.threshold)) if impostor else None
        ),
        "rank1_identification": float(np.mean(hits)) if hits else None,
        "rank1_chance": mean_chance,
        "rank1_hits": int(sum(hits)),
        "rank1_trials": len(hits),
        "rank1_p_value": None
        if mean_chance is None
        else rank1_p_value(sum(hits), len(hits), mean_chance),
        # dlib's 68 landmarks (dlib-family recognisers only)
        "mean_landmark_shift": float(np.mean(shifts)) if shifts else None,
        "n_landmark_pairs": len(shifts),
        "reidentification_rate": ver["tar_at_threshold"],
    }


# ------------------------------------------------------------------ unpaired attack
def compute_unpaired(
    images: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    policy: AuditPolicy,
    recogniser: fr.Recogniser | fm.Embedder,
    sightings: SightingIndex | None = None,
) -> FaceReidNumbers:
    """One recogniser's match rate of released faces with training faces, against held-out
    faces (`sightings`: the recogniser's faces already found, `map_sightings`)."""
    index = sightings if sightings is not None else SightingIndex(as_recogniser(recogniser))
    rec = index.recogniser
    rel_idx, train_idx, heldout_idx = unpaired_sample(len(images), sensitive, heldout, policy)

    def embeddings(tag: str, data: np.ndarray, idx: np.ndarray) -> np.ndarray:
        embs = [s.embedding for i in idx for s in index.of(tag, int(i), data[int(i)])]
        return np.stack(embs) if embs else np.zeros((0, 1))

    rel = embeddings("release", images, rel_idx)
    train = embeddings("sensitive", sensitive.images, train_idx)
    thr = rec.threshold

    def match_rate(gallery: np.ndarray) -> float | None:
        if len(rel) == 0 or len(gallery) == 0:
            return None
        nearest = np.min(rec.distances(rel[:, None], gallery[None]), axis=1)
        return float(np.mean(nearest < thr))

    rate_train = match_rate(train)
    rate_heldout = None
    if heldout is not None and heldout_idx is not None:
        rate_heldout = match_rate(embeddings("heldout", heldout.images, heldout_idx))
    excess = (
        None
        if rate_train is None
        else rate_train - (rate_heldout if rate_heldout is not None else 0.0)
    )
    details = {
        "mode": "unpaired",
        "recogniser": rec.key,
        "embedder": rec.name,
        "threshold": thr,
        "n_released_faces": len(rel),
        "n_training_faces": len(train),
        "match_rate_training": rate_train,
        "match_rate_heldout": rate_heldout,
        "reidentification_rate": None if excess is None else max(0.0, excess),
    }
    return FaceReidNumbers("unpaired", details)


def unpaired_sample(
    n_released: int, sensitive: ImageDataset, heldout: ImageDataset | None, policy: AuditPolicy
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The released, training and held-out images the unpaired attack embeds (the same for every
    recogniser): drawn in that order from the policy's seed."""
    rng = np.random.default_rng(policy.seed)
    samples = policy.section(FacePolicy).face_samples
    m = samples if heldout is None else min(samples, len(heldout))
    rel = sample_idx(n_released, samples, rng)
    train = sample_idx(len(sensitive), m, rng)
    held = None if heldout is None else sample_idx(len(heldout), m, rng)
    return rel, train, held


# ------------------------------------------------------------------ every image's faces, mapped
def map_sightings(
    images: np.ndarray,
    sources: list[np.ndarray] | None,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    policy: AuditPolicy,
    map_items: MapItems = in_process,
) -> list[SightingIndex]:
    """Every policy recogniser's faces in every image the attack reads (`image_sightings` mapped
    by `map_items`: here, or on the run's workers), one index per recogniser."""
    job = sightings_job(policy)
    wanted: list[tuple[str, int, np.ndarray]]
    if sources is not None:
        attacked, gallery = paired_sample(len(images), sources, len(sensitive), policy)
        wanted = [("sensitive", g, sensitive.images[g]) for g in gallery]
        wanted += [("release", int(r), images[int(r)]) for r in attacked]
    else:
        rel, train, held = unpaired_sample(len(images), sensitive, heldout, policy)
        wanted = [("release", int(i), images[int(i)]) for i in rel]
        wanted += [("sensitive", int(i), sensitive.images[int(i)]) for i in train]
        if heldout is not None and held is not None:
            wanted += [("heldout", int(i), heldout.images[int(i)]) for i in held]
    found = map_items(
        image_sightings, job, [image for *_, image in wanted], label=SIGHTINGS_STAGE, keep=False
    )
    indexes = [SightingIndex(rec) for rec in job_recognisers(job)]
    for (tag, i, _), per_rec in zip(wanted, found, strict=True):
        for index, faces in zip(indexes, per_rec, strict=True):
            index.found[(tag, i)] = faces
    return indexes


# ------------------------------------------------------------------ the attack of a release
def face_attacks(inputs: AuditInputs, images: np.ndarray, policy: AuditPolicy) -> list[CheckResult]:
    """The face re-identification attack where the data are faces (policy
    `face_reidentification`: "auto" asks the detector about the sensitive set): the attack the
    image and photograph kinds add (audit.kinds.builtin). On an empirical de-identification
    release it is required: the guarantee rests on it, so "not run" is a failure."""
    from synth.registry import DP

    required = inputs.guarantee_kind not in (DP, "k-anonymity")
    sensitive = inputs.sensitive
    if not isinstance(sensitive, ImageDataset):  # not pictures: nothing for a face detector
        return []
    mode = policy.section(FacePolicy).face_reidentification
    if mode == "off":
        if not required:
            return []
        return [_cannot_run(CHECK, "attack", 'face_reidentification = "off" in [policy]', policy)]
    if mode == "auto":
        present, found = faces_present(sensitive, policy)
        if not present and not required:
            return []
        if not present:
            return [
                CheckResult(
                    CHECK,
                    "attack",
                    False,
                    "not run: the detector found a face in only "
                    f"{found['with_a_face']} of {found['probed']} sensitive images, and face "
                    f"re-identification is the only attack on a {inputs.guarantee_kind} release",
                    found,
                )
            ]
    sources = None if inputs.clusters is None else list(inputs.clusters)
    checks = _guard(
        CHECK,
        "attack",
        lambda: run_face_reid(
            images,
            sources,
            sensitive,
            inputs.heldout,
            policy,
            inputs.searched_recognisers,
            inputs.map_items or in_process,
            inputs.shape_replaced_share,
        ),
    )
    if inputs.part_clusters and sources is not None:
        checks += donor_attacks(inputs, images, sources, policy)
    return checks


def donor_attacks(
    inputs: AuditInputs, images: np.ndarray, sources: list[np.ndarray], policy: AuditPolicy
) -> list[CheckResult]:
    """A k-Same-M release's donor re-identification, one check per policy recogniser
    (audit.face_donors)."""
    from audit.face_donors import CHECK as DONORS
    from audit.face_donors import compute_donor_reid, judge_donor_reid

    clusters, k = inputs.part_clusters or [], int(inputs.part_cluster_k or 2)
    alpha = policy.section(FacePolicy).face_rank1_alpha
    out: list[CheckResult] = []
    for rec in policy_recognisers(policy):
        out += _guard(
            f"{DONORS}[{rec.key}]",
            "attack",
            lambda rec=rec: judge_donor_reid(  # type: ignore[misc]
                compute_donor_reid(images, sources, inputs.sensitive, clusters, rec, k), alpha
            ),
        )
    return out


# ------------------------------------------------------------------ verdicts
def face_check_note(check: str, parameters: Mapping[str, Any]) -> str:
    """What a check's row adds beside its verdict: for a face recogniser's re-identification check
    of a release whose mechanism names the recognisers it searched against, whether this one was
    searched against or held out ("" otherwise)."""
    key = recogniser_of_check(check)
    if key is None:
        return ""
    return recogniser_role(key, searched_keys(parameters.get("searched_recognisers"))) or ""


def recogniser_of_check(name: str) -> str | None:
    """The recogniser key of a `face_reidentification[KEY]` check name (None for other checks)."""
    prefix = CHECK + "["
    return name[len(prefix) : -1] if name.startswith(prefix) and name.endswith("]") else None


def recogniser_role(key: str, searched: Sequence[str] | None) -> str | None:
    """Whether the mechanism searched against this recogniser (None: it names none)."""
    if searched is None:
        return None
    return "searched against" if key in searched else "held out (the mechanism never measured it)"


def searched_keys(searched: Sequence[str] | None) -> list[str] | None:
    """The recogniser keys a release's `searched_recognisers` names (keys, or the recognisers'
    names)."""
    if searched is None:
        return None
    by_name = {getattr(make, "name", None): key for key, make in fr.RECOGNISERS.items()}
    return [by_name.get(s, s) for s in searched]


def _paired_verdict(d: dict[str, Any], policy: AuditPolicy) -> tuple[bool | None, str]:
    faces = policy.section(FacePolicy)
    rate, limit, alpha = (
        d["reidentification_rate"],
        faces.face_max_verification_rate,
        faces.face_rank1_alpha,
    )
    tar3 = d.get("tar_at_far_0.001")
    rank1, p = d.get("rank1_identification"), d.get("rank1_p_value")
    summary = (
        f"verification TAR {rate:.3f} at distance < {d['threshold']:.3g} "
        f"(FAR {d['far_at_threshold'] or 0:.4f}), at FAR 1e-3 "
        + ("n/a" if tar3 is None else f"{tar3:.3f}")
        + "; rank-1 "
        + (
            "n/a"
            if rank1 is None
            else f"{d['rank1_hits']}/{d['rank1_trials']} (chance {d['rank1_chance']:.3f}, "
            f"p = {p:.2g})"
        )
    )
    limits, failed = [], []
    if limit is not None:
        limits.append(f"max TAR {limit:g}")
        if rate > limit:
            failed.append("verified")
    if alpha and p is not None:  # 0 (or none): rank-1 informational
        limits.append(f"rank-1 above chance at p < {alpha:g} fails")
        if p < alpha:
            failed.append("identified above chance")
    if faces.face_max_rank1_rate is not None and rank1 is not None:
        limits.append(f"max rank-1 {faces.face_max_rank1_rate:g}")
        if rank1 > faces.face_max_rank1_rate:
            failed.append("rank-1 over its ceiling")
    if limits:
        summary += "; " + ", ".join(limits)
    if failed:
        summary += ": " + " and ".join(failed)
    return (None if not limits else not failed), summary


def check_face_reid(
    numbers: FaceReidNumbers | Sequence[FaceReidNumbers],
    policy: AuditPolicy,
    searched: Sequence[str] | None = None,
) -> list[CheckResult]:
    """One attack check per recogniser (`face_reidentification[KEY]`); `searched`: the recogniser
    keys the mechanism searched against (the others are held out)."""
    out = []
    for n in [numbers] if isinstance(numbers, FaceReidNumbers) else numbers:
        d, limit = n.details, policy.section(FacePolicy).face_max_verification_rate
        role = recogniser_role(n.key, searched)
        details = {**d, "role": role} if role else d
        head = f"{n.key}" + (f", {role}" if role else "") + ": "
        if n.rate is None:
            summary = "no released face was detected: nothing to re-identify with this detector"
            passed = None if limit is None else True
        elif n.mode == "paired":
            passed, summary = _paired_verdict(d, policy)
        else:
            ho = d.get("match_rate_heldout")
            summary = (
                f"released faces within {d['threshold']:.3g} of a training face: "
                f"{d['match_rate_training']:.3f}"
                + ("" if ho is None else f" (held-out faces: {ho:.3f})")
                + f"; excess {n.rate:.3f}"
                + (f", max {limit:g}" if limit is not None else "")
            )
            passed = None if limit is None else n.rate <= limit
        out.append(CheckResult(check_name(n.key), "attack", passed, head + summary, details))
    return out


# ------------------------------------------------------------------ realism
def _face_region(shape: tuple[int, ...], box: tuple[float, ...]) -> tuple[slice, slice]:
    x0, y0 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x1, y1 = min(shape[1], int(np.ceil(box[2]))), min(shape[0], int(np.ceil(box[3])))
    return slice(y0, max(y0 + 1, y1)), slice(x0, max(x0 + 1, x1))


def blur_face(image: np.ndarray, box: tuple[float, ...], sigma: float = BLUR_SIGMA) -> np.ndarray:
    """The photo with a Gaussian blur (sigma pixels) over the face box: the simplest
    de-identification, a baseline for realism."""
    from scipy.ndimage import gaussian_filter

    out = fm.as_rgb(image).copy()
    blurred = gaussian_filter(out.astype(np.float64), (sigma, sigma, 0), mode="nearest")
    ys, xs = _face_region(out.shape, box)
    out[ys, xs] = np.clip(np.rint(blurred[ys, xs]), 0, 255).astype(np.uint8)
    return out


def pixelate_face(
    image: np.ndarray, box: tuple[float, ...], blocks: int = PIXEL_BLOCKS
) -> np.ndarray:
    """The photo with the face box pixelated, `blocks` blocks across: the other baseline."""
    from PIL import Image

    out = fm.as_rgb(image).copy()
    ys, xs = _face_region(out.shape, box)
    face = out[ys, xs]
    h, w = face.shape[:2]
    small = Image.fromarray(face).resize(
        (blocks, max(1, round(blocks * h / w))), Image.Resampling.BOX
    )
    out[ys, xs] = np.asarray(small.resize((w, h), Image.Resampling.NEAREST))
    return out


def _facenet_features(crops: list[np.ndarray]) -> np.ndarray:
    """FaceNet embeddings of crops, one at a time (its graph refuses batches of more than one)."""
    return np.concatenate([fr.facenet_embed(c[None]) for c in crops])


def compute_realism(
    images: np.ndarray,
    sources: list[np.ndarray],
    sensitive: ImageDataset,
    policy: AuditPolicy,
    map_items: MapItems = in_process,
) -> dict[str, Any] | None:
    """YuNet's view of the replaced faces of the attacked photos that keep their source's frame:
    retention, landmark shift and KID against blur and pixelation (None: no such photo). Each
    photo is one item (`realism_photo`), mapped by `map_items`."""
    attacked, _ = paired_sample(len(images), sources, len(sensitive), policy)
    same = [int(r) for r in attacked if _same_frame(images, int(r), sources, sensitive)]
    if not same:
        return None
    pairs = [(sensitive.images[int(np.asarray(sources[r]).ravel()[0])], images[r]) for r in same]
    photos = map_items(realism_photo, None, pairs, label=REALISM_STAGE, keep=False)
    replaced = sum(p.replaced for p in photos)
    retained = sum(p.retained for p in photos)
    shifts = [x for p in photos for x in p.shifts]
    kids: dict[str, float | None] = {}
    auc: float | None = None
    if replaced >= 2:
        features = {
            k: np.concatenate([p.features[k] for p in photos if p.replaced])
            for k in ("original", "release", "blurred", "pixelated")
        }
        kids = {
            k: kid(features[k], features["original"]) for k in ("release", "blurred", "pixelated")
        }
        auc = two_sample_auc(features["release"], features["original"])
    return {
        "two_sample_auc": auc,
        "n_photos": len(same),
        "n_replaced_faces": replaced,
        "n_retained": retained,
        "detection_retention": retained / replaced if replaced else None,
        "detection_confidence": fr.REALISM_DETECTION,
        "retention_iou": RETENTION_IOU,
        "mean_landmark_shift_yunet5": float(np.mean(shifts)) if shifts else None,
        "n_landmark_faces": len(shifts),
        "mean_sharpness_ratio": float(np.mean(sharp))
        if (sharp := [x for p in photos for x in p.sharpness])
        else None,
        "sharpness_ratios": [round(x, 3) for p in photos for x in p.sharpness],
        "kid_release": kids.get("release"),
        "kid_blurred": kids.get("blurred"),
        "kid_pixelated": kids.get("pixelated"),
        "kid_features": "FaceNet (unit 512-d) of 160 x 160 crops at the original's YuNet points",
        "kid_n_faces": replaced,
        "blur_sigma": BLUR_SIGMA,
        "pixel_blocks": PIXEL_BLOCKS,
    }


def _face_to_ring(image: np.ndarray, box: tuple[float, ...]) -> float | None:
    """The spread of the grey Laplacian inside the face box over that in the ring around it
    (the box grown by half): how sharp the face is against its own photo."""
    import cv2

    h, w = image.shape[:2]
    x0, y0, x1, y1 = box
    gx, gy = 0.5 * (x1 - x0), 0.5 * (y1 - y0)
    a, b = max(0, int(x0 - gx)), max(0, int(y0 - gy))
    c, d = min(w, int(np.ceil(x1 + gx))), min(h, int(np.ceil(y1 + gy)))
    grey = cv2.cvtColor(np.ascontiguousarray(image[b:d, a:c]), cv2.COLOR_RGB2GRAY)
    lap = cv2.Laplacian(grey.astype(np.float32), cv2.CV_32F)
    inner = np.zeros(lap.shape, bool)
    inner[max(0, int(y0) - b) : int(y1) - b, max(0, int(x0) - a) : int(x1) - a] = True
    if inner.sum() < 16 or (~inner).sum() < 16:
        return None
    ring = float(lap[~inner].std())
    return float(lap[inner].std()) / ring if ring > 1e-6 else None


def sharpness_ratio(
    original: np.ndarray, released: np.ndarray, box: tuple[float, ...]
) -> float | None:
    """The released face's sharpness against its ring over the original's (1: as sharp relative
    to its photo as the original was; a replaced face softer or crisper than its photo is the
    tell)."""
    before, after = _face_to_ring(original, box), _face_to_ring(released, box)
    return None if not before or after is None else after / before


@dataclass(frozen=True)
class RealismPhoto:
    """One photo's replaced faces as YuNet sees them: how many, how many it still finds, their
    landmark shifts, and the FaceNet features of each variant's crops (one row a face)."""

    replaced: int
    retained: int
    shifts: list[float]
    features: dict[str, np.ndarray]
    sharpness: list[float] = field(default_factory=list)  # released / original, per face


def realism_photo(config: None, item: tuple[np.ndarray, np.ndarray]) -> RealismPhoto:
    """The realism measures of one (original, released) photo: the audit's per-item function
    (module-level, so that a Dask worker can run it)."""
    original, released = fm.as_rgb(item[0]), fm.as_rgb(item[1])
    found = fr.yunet_detect(released, fr.REALISM_DETECTION)
    replaced = retained = 0
    shifts: list[float] = []
    crops: dict[str, list[np.ndarray]] = {
        "original": [],
        "release": [],
        "blurred": [],
        "pixelated": [],
    }
    for row in fr.yunet_detect(original, fr.REALISM_DETECTION):
        replaced += 1
        retained += _realism_face(original, released, found, row, shifts, crops)
    features = {k: _facenet_features(v) for k, v in crops.items()} if replaced else {}
    ratios = [
        sharpness_ratio(original, released, fr.yunet_box(row))
        for row in fr.yunet_detect(original, fr.REALISM_DETECTION)
    ]
    return RealismPhoto(replaced, retained, shifts, features, [r for r in ratios if r])


def _realism_face(
    original: np.ndarray,
    released: np.ndarray,
    found: np.ndarray,
    row: np.ndarray,
    shifts: list[float],
    crops: dict[str, list[np.ndarray]],
) -> bool:
    """One original face (YuNet `row`): whether YuNet still finds it in the release (True), its
    landmark shift into `shifts`, and its crops (original, released, blurred, pixelated) into
    `crops`."""
    box, points = fr.yunet_box(row), fr.yunet_points(row)
    ious = [fm.box_iou(fr.yunet_box(f), box) for f in found]
    retained = bool(ious and max(ious) >= RETENTION_IOU)
    if retained:
        there: np.ndarray | None = found[int(np.argmax(ious))]
    else:  # how far the landmarks moved, even for a face YuNet hardly sees
        there = fr.yunet_at(released, box)
    if there is not None:
        moved = np.linalg.norm(fr.yunet_points(there) - points, axis=1).mean()
        shifts.append(float(moved / max(np.linalg.norm(points[0] - points[1]), 1e-9)))
    # every variant cut at the original's points: KID compares appearance, not framing
    for name, photo in (
        ("original", original),
        ("release", released),
        ("blurred", blur_face(original, box)),
        ("pixelated", pixelate_face(original, box)),
    ):
        crops[name].append(fr.facenet_crop(photo, points))
    return retained


def check_realism(
    realism: dict[str, Any],
    policy: AuditPolicy,
    dlib_shift: float | None = None,
    strict_share: float | None = None,
) -> list[CheckResult]:
    """Utility checks of replaced faces: YuNet still finds them, their landmarks stay (the limit
    weighs in strict geometry's by `strict_share`, the share of faces drawn in it), and they
    look more like faces than blurred ones do (KID)."""
    d, n = realism, realism["n_replaced_faces"]
    if n == 0:
        return [
            CheckResult(
                RETENTION_CHECK,
                "utility",
                None,
                f"YuNet found no face at confidence {fr.REALISM_DETECTION:g} in the "
                f"{d['n_photos']} original photos attacked: nothing to compare",
                d,
            )
        ]
    out = [_retention_check(d, n, policy)]
    moved = _geometry_check(d, policy, dlib_shift, strict_share or 0.0)
    if moved is not None:
        out.append(moved)
    out.append(_kid_check(d, n, policy))
    if d.get("mean_sharpness_ratio") is not None:
        out.append(_sharpness_check(d))
    return out


def _sharpness_check(d: dict[str, Any]) -> CheckResult:
    """How sharp the replaced faces are against their photos, relative to the originals
    (reported, not gated: a face softer or crisper than its photo is the tell)."""
    ratios = d["sharpness_ratios"]
    inside = sum(SHARPNESS_RANGE[0] <= r <= SHARPNESS_RANGE[1] for r in ratios)
    return CheckResult(
        SHARPNESS_CHECK,
        "utility",
        None,
        f"face / surrounding sharpness (Laplacian spread) released over original: mean "
        f"{d['mean_sharpness_ratio']:.2f}, {inside} of {len(ratios)} faces within "
        f"{SHARPNESS_RANGE[0]:g}-{SHARPNESS_RANGE[1]:g} (reported, not gated)",
        {"mean_sharpness_ratio": d["mean_sharpness_ratio"], "ratios": ratios},
    )


def _retention_check(d: dict[str, Any], n: int, policy: AuditPolicy) -> CheckResult:
    """The share of replaced faces YuNet still finds at the original's place."""
    keep, lim = d["detection_retention"], policy.section(FacePolicy).face_min_detection_retention
    return CheckResult(
        RETENTION_CHECK,
        "utility",
        None if lim is None else keep >= lim,
        f"YuNet finds {d['n_retained']} of {n} replaced faces (confidence >= "
        f"{fr.REALISM_DETECTION:g}, IoU >= {RETENTION_IOU:g} with the original's box): "
        f"{keep:.3f}" + (f"; min {lim:g}" if lim is not None else ""),
        d,
    )


def _geometry_check(
    d: dict[str, Any], policy: AuditPolicy, dlib_shift: float | None, strict: float = 0.0
) -> CheckResult | None:
    """How far YuNet's 5 landmarks moved (pose and expression kept); None without landmarks.
    `strict`: the share of faces drawn in k-Same-M's strict geometry, each judged by that
    geometry's limit (the mean shift against the mean of the faces' limits)."""
    lim = _shift_limit(policy.section(FacePolicy), strict)
    shift = d["mean_landmark_shift_yunet5"]
    if shift is None:
        return None
    extra = "" if dlib_shift is None else f"; dlib's 68 landmarks {dlib_shift:.3f}"
    return CheckResult(
        GEOMETRY_CHECK,
        "utility",
        None if lim is None else shift <= lim,
        f"YuNet's 5 landmarks moved {shift:.3f} inter-ocular distances on average over "
        f"{d['n_landmark_faces']} faces{extra} (pose and expression kept"
        + (f"; max {lim:.3g}" if lim is not None else "")
        + (f", {strict:.0%} of them in strict geometry: the average's shape)" if strict else ")"),
        {
            "mean_landmark_shift": shift,
            "mean_landmark_shift_dlib68": dlib_shift,
            "n_faces": d["n_landmark_faces"],
        },
    )


def _shift_limit(faces: FacePolicy, strict: float) -> float | None:
    """The landmark limit for a release with a `strict` share of faces in strict geometry."""
    plain, loose = faces.face_max_landmark_shift, faces.face_max_landmark_shift_strict
    if plain is None or (strict > 0 and loose is None):
        return None
    return plain if not strict or loose is None else (1 - strict) * plain + strict * loose


def _kid_check(d: dict[str, Any], n: int, policy: AuditPolicy) -> CheckResult:
    """The KID of released against original faces, beside blurred and pixelated originals'."""
    rel, blur, pix = d["kid_release"], d["kid_blurred"], d["kid_pixelated"]
    gated = policy.section(FacePolicy).face_max_kid_vs_blur
    if rel is None or blur is None:
        return CheckResult(
            KID_CHECK,
            "utility",
            None,
            f"KID needs at least two replaced faces, {n} found",
            d,
        )
    return CheckResult(
        KID_CHECK,
        "utility",
        (rel < blur) if gated else None,
        f"KID of released against original faces {rel:.2e} (FaceNet features, n = {n}); "
        f"blurred originals {blur:.2e}, pixelated {pix:.2e}"
        + ("; must be below blur's" if gated else "")
        + (
            ""
            if d.get("two_sample_auc") is None
            else f"; a classifier tells released from original at AUC {d['two_sample_auc']:.2f}"
        )
        + (" (few faces: noisy)" if n < 50 else ""),
        d,
    )


# ------------------------------------------------------------------ entry points
def faces_present(data: ImageDataset, policy: AuditPolicy) -> tuple[bool, dict[str, Any]]:
    """Whether the data set holds faces: images of at least MIN_FACE_IMAGE pixels a side, the
    detector finding one in at least half of `face_probe` images drawn from it (the rule of
    `face_reidentification = "auto"`)."""
    if min(data.image_shape[:2]) < MIN_FACE_IMAGE:
        return False, {"probed": 0, "with_a_face": 0, "reason": "images too small for faces"}
    rng = np.random.default_rng(policy.seed)
    idx = sample_idx(len(data), policy.section(FacePolicy).face_probe, rng)
    found = sum(bool(fm.detect(data.images[int(i)])) for i in idx)
    return 2 * found >= len(idx), {"probed": len(idx), "with_a_face": found}


def run_face_reid(
    images: np.ndarray,
    sources: list[np.ndarray] | None,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    policy: AuditPolicy,
    searched: Sequence[str] | None = None,
    map_items: MapItems = in_process,
    strict_share: float | None = None,
) -> list[CheckResult]:
    """Every recogniser of the policy against the release (one check each), then, for paired
    releases whose faces stay in place, the realism checks (`strict_share`: the share of faces
    drawn in k-Same-M's strict geometry). Every image's faces are found first, by `map_items`
    (`map_sightings`)."""
    indexes = map_sightings(images, sources, sensitive, heldout, policy, map_items)
    numbers = [
        compute_paired(images, sources, sensitive, policy, index.recogniser, index)
        if sources is not None
        else compute_unpaired(images, sensitive, heldout, policy, index.recogniser, index)
        for index in indexes
    ]
    out = check_face_reid(numbers, policy, searched_keys(searched))
    if sources is not None:
        realism = compute_realism(images, sources, sensitive, policy, map_items)
        if realism is not None:
            dlib_shift = next(
                (n.details["mean_landmark_shift"] for n in numbers if n.key == "dlib"), None
            )
            out += check_realism(realism, policy, dlib_shift, strict_share)
    return out
