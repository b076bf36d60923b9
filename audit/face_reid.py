"""Face re-identification attack: can a face recogniser tell who is in the released images?

Faces are detected, aligned and embedded (synth.face_models: CenterFace, dlib landmarks, dlib's
128-d descriptor) in the release and in the sensitive originals.

- **Paired** (each released image names its source records: face de-identification, one source
  per photo; k-anonymous releases, k sources per average): genuine pairs are a released face and
  the matching face of a source (the same place in the photo, or the largest face of each image
  when they differ in framing). Verification: the true-accept rate (TAR) at the
  recogniser's own threshold (dlib: distance < 0.6 = same person) and at the thresholds where its
  false-accept rate (FAR) on real faces (pairs of different original faces: the operating point an
  attacker sets before seeing the release) is 1e-3 and 1e-2; identification: rank-1 rate of each
  released face against the gallery of original faces (hit = the nearest original face is one it
  replaced or averaged). Where released and original faces sit at the same place, the mean
  displacement of the 68 landmarks, both predicted in the original's face box (in inter-ocular
  distances), says how much pose and expression moved.
- **Unpaired** (synthetic releases, e.g. PrivImage): the share of released faces within the
  threshold of some training face, against the same share for an equal number of held-out faces.

Impostor pairs assume that different faces of the original photos are different people; where one
person has several records, their pairs count as impostors and the FAR-based thresholds come out
lower (the fixed-threshold TAR is unaffected). With fewer than 1/FAR impostor pairs, the threshold
at that FAR is the closest impostor pair's distance (`far_resolution` in the details).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from audit.images import sample_idx
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth import face_models as fm
from synth.datasets import ImageDataset

CHECK = "face_reidentification"
GEOMETRY_CHECK = "face_geometry"
FARS = (1e-3, 1e-2)
MIN_FACE_IMAGE = 32  # smaller images (digits) are never probed: no recognisable face fits
SAME_PLACE_IOU = 0.3  # a released face this close to an original face's box is its replacement


@dataclass
class FaceIndex:
    """Detected faces and their embeddings, per image, computed once per audit."""

    embedder: fm.Embedder
    faces: dict[tuple[str, int], list[tuple[fm.Face, np.ndarray]]] = field(default_factory=dict)

    def of(self, tag: str, i: int, image: np.ndarray) -> list[tuple[fm.Face, np.ndarray]]:
        """The faces of `image`; a small image (an aligned crop, an average of crops) in which the
        detector finds none is taken as one face filling the frame where the alignment template
        puts it: an attacker who knows the images are aligned faces does not need a detector."""
        key = (tag, int(i))
        if key not in self.faces:
            faces = fm.detect(image)
            if not faces and max(image.shape[:2]) <= fm.SMALL_IMAGE:
                faces = [fm.aligned_face(image)]
            self.faces[key] = [(f, self.embedder.embed(image, f)) for f in faces]
        return self.faces[key]

    def at(self, image: np.ndarray, face: fm.Face) -> tuple[fm.Face, np.ndarray]:
        """The face of `image` at `face`'s box (landmarks predicted there), embedded."""
        there = fm.Face(face.box, 0.0, fm.landmarks(image, face.box))
        return there, self.embedder.embed(image, there)


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
    the `impostor` pairs."""
    genuine, impostor = np.asarray(genuine, float), np.asarray(impostor, float)
    out: dict[str, Any] = {
        "threshold": threshold,
        "tar_at_threshold": float(np.mean(genuine < threshold)) if len(genuine) else None,
        "far_at_threshold": float(np.mean(impostor < threshold)) if len(impostor) else None,
        "n_genuine": len(genuine),
        "n_impostor": len(impostor),
        "far_resolution": 1.0 / len(impostor) if len(impostor) else None,
        "median_genuine_distance": float(np.median(genuine)) if len(genuine) else None,
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


def _pair_faces(
    released: list[tuple[fm.Face, np.ndarray]],
    original: list[tuple[fm.Face, np.ndarray]],
    same_frame: bool,
) -> list[tuple[int, int, bool]]:
    """(released face, original face, same place?) pairs: by box overlap when both images share a
    frame, else the largest face of each."""
    pairs = []
    if same_frame:
        for j, (of, _) in enumerate(original):
            ious = [fm.box_iou(rf.box, of.box) for rf, _ in released]
            if ious and max(ious) >= SAME_PLACE_IOU:
                pairs.append((int(np.argmax(ious)), j, True))
    if not pairs and released and original:
        pairs.append((0, 0, False))
    return pairs


@dataclass(frozen=True)
class FaceReidNumbers:
    mode: str  # "paired" | "unpaired"
    details: dict[str, Any]

    @property
    def rate(self) -> float | None:
        """The re-identification rate the policy gates: TAR at the threshold (paired), or the
        training match rate above the held-out one (unpaired)."""
        return self.details.get("reidentification_rate")


def compute_paired(
    images: np.ndarray,
    sources: list[np.ndarray],
    sensitive: ImageDataset,
    policy: AuditPolicy,
    embedder: fm.Embedder,
) -> FaceReidNumbers:
    rng = np.random.default_rng(policy.seed)
    index = FaceIndex(embedder)
    attacked = sample_idx(len(images), policy.face_samples, rng)
    used = {int(s) for r in attacked for s in np.asarray(sources[r]).ravel()}
    others = np.setdiff1d(np.arange(len(sensitive)), sorted(used))
    extra = others[sample_idx(len(others), max(0, policy.face_samples - len(used)), rng)]
    gallery_ids = sorted(used | {int(i) for i in extra})
    gallery = [
        (g, k, face, emb)
        for g in gallery_ids
        for k, (face, emb) in enumerate(index.of("sensitive", g, sensitive.images[g]))
    ]
    where = {(g, k): n for n, (g, k, _, _) in enumerate(gallery)}
    g_emb = np.stack([e for *_, e in gallery]) if gallery else np.zeros((0, 128))
    genuine, impostor, shifts, rank1_hits, chance = [], [], [], [], []
    released_faces = unmatched = 0
    for r in attacked:
        rel = list(index.of("release", r, images[r]))
        released_faces += len(rel)
        src = sorted({int(s) for s in np.asarray(sources[r]).ravel()})
        same_frame = images[r].shape == sensitive.images[0].shape and len(src) == 1
        targets: dict[int, set[int]] = {}  # released face -> its original faces (gallery rows)
        for s in src:
            orig = index.of("sensitive", s, sensitive.images[s])
            pairs = _pair_faces(rel, orig, same_frame)
            missed = sorted(set(range(len(orig))) - {j for _, j, _ in pairs})
            unmatched += len(missed)
            if same_frame:  # the detector missed it: the attacker looks where the original was
                for j in missed:
                    rel = rel + [index.at(images[r], orig[j][0])]
                    pairs.append((len(rel) - 1, j, True))
            for a, b, same_place in pairs:
                genuine.append(float(np.linalg.norm(rel[a][1] - orig[b][1])))
                targets.setdefault(a, set()).add(where[(s, b)])
                if same_place:  # landmarks of both at the original's box: the face's geometry
                    box = orig[b][0].box
                    shifts.append(
                        fm.landmark_shift(orig[b][0].landmarks, fm.landmarks(images[r], box))
                    )
        for a, (_, emb) in enumerate(rel):
            d = np.linalg.norm(g_emb - emb, axis=1)
            mine = np.zeros(len(gallery), bool)
            mine[sorted(targets.get(a, set()))] = True
            impostor.extend(d[~mine].tolist())
            if mine.any():
                rank1_hits.append(bool(mine[int(np.argmin(d))]))
                chance.append(float(mine.mean()))
    # the recogniser's operating points, calibrated on real faces: pairs of different original faces
    first, second = np.triu_indices(len(gallery), 1)
    reference = np.linalg.norm(g_emb[first] - g_emb[second], axis=1)
    ver = verification(np.array(genuine), reference, embedder.threshold)
    details = {
        "mode": "paired",
        "embedder": embedder.name,
        "n_released_attacked": len(attacked),
        "n_released_faces": released_faces,
        "n_gallery_records": len(gallery_ids),
        "n_gallery_faces": len(gallery),
        # not found by the detector in the release (same frame: attacked at the original's place)
        "original_faces_not_found_in_release": unmatched,
        **ver,
        "far_calibration": "pairs of different original faces",
        "release_impostor_pairs": len(impostor),
        "release_far_at_threshold": (
            float(np.mean(np.array(impostor) < embedder.threshold)) if impostor else None
        ),
        "rank1_identification": float(np.mean(rank1_hits)) if rank1_hits else None,
        "rank1_chance": float(np.mean(chance)) if chance else None,
        "mean_landmark_shift": float(np.mean(shifts)) if shifts else None,
        "n_landmark_pairs": len(shifts),
        "reidentification_rate": ver["tar_at_threshold"],
    }
    return FaceReidNumbers("paired", details)


def compute_unpaired(
    images: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    policy: AuditPolicy,
    embedder: fm.Embedder,
) -> FaceReidNumbers:
    rng = np.random.default_rng(policy.seed)
    index = FaceIndex(embedder)

    def embeddings(tag: str, data: np.ndarray, idx: np.ndarray) -> np.ndarray:
        embs = [e for i in idx for _, e in index.of(tag, int(i), data[int(i)])]
        return np.stack(embs) if embs else np.zeros((0, 128))

    m = policy.face_samples
    if heldout is not None:
        m = min(m, len(heldout))
    rel = embeddings("release", images, sample_idx(len(images), policy.face_samples, rng))
    train = embeddings("sensitive", sensitive.images, sample_idx(len(sensitive), m, rng))
    thr = embedder.threshold

    def match_rate(gallery: np.ndarray) -> float | None:
        if len(rel) == 0 or len(gallery) == 0:
            return None
        nearest = np.min(np.linalg.norm(rel[:, None] - gallery[None], axis=2), axis=1)
        return float(np.mean(nearest < thr))

    rate_train = match_rate(train)
    rate_heldout = None
    if heldout is not None:
        rate_heldout = match_rate(
            embeddings("heldout", heldout.images, sample_idx(len(heldout), m, rng))
        )
    excess = (
        None
        if rate_train is None
        else rate_train - (rate_heldout if rate_heldout is not None else 0.0)
    )
    details = {
        "mode": "unpaired",
        "embedder": embedder.name,
        "threshold": thr,
        "n_released_faces": len(rel),
        "n_training_faces": len(train),
        "match_rate_training": rate_train,
        "match_rate_heldout": rate_heldout,
        "reidentification_rate": None if excess is None else max(0.0, excess),
    }
    return FaceReidNumbers("unpaired", details)


def check_face_reid(numbers: FaceReidNumbers, policy: AuditPolicy) -> list[CheckResult]:
    d, limit = numbers.details, policy.face_max_verification_rate
    rate = numbers.rate
    if rate is None:
        summary = "no released face was detected: nothing to re-identify with this detector"
        passed = None if limit is None else True
    elif numbers.mode == "paired":
        rank1 = d.get("rank1_identification")
        tar3 = d.get("tar_at_far_0.001")
        summary = (
            f"verification against the originals: TAR {rate:.3f} at distance < {d['threshold']:g} "
            f"(FAR {d['far_at_threshold'] or 0:.4f}); TAR at FAR 1e-3 "
            + ("n/a" if tar3 is None else f"{tar3:.3f}")
            + "; rank-1 identification "
            + ("n/a" if rank1 is None else f"{rank1:.3f} (chance {d['rank1_chance']:.3f})")
            + (f"; max TAR {limit}" if limit is not None else "")
        )
        passed = None if limit is None else rate <= limit
        if policy.face_max_rank1_rate is not None and rank1 is not None:
            summary += f", max rank-1 {policy.face_max_rank1_rate}"
            passed = bool(passed is not False and rank1 <= policy.face_max_rank1_rate)
    else:
        ho = d.get("match_rate_heldout")
        summary = (
            f"released faces within {d['threshold']:g} of a training face: "
            f"{d['match_rate_training']:.3f}"
            + ("" if ho is None else f" (held-out faces: {ho:.3f})")
            + f"; excess {rate:.3f}"
            + (f", max {limit}" if limit is not None else "")
        )
        passed = None if limit is None else rate <= limit
    out = [CheckResult(CHECK, "attack", passed, summary, d)]
    shift = d.get("mean_landmark_shift")
    if shift is not None:
        lim = policy.face_max_landmark_shift
        out.append(
            CheckResult(
                GEOMETRY_CHECK,
                "utility",
                None if lim is None else shift <= lim,
                f"68 landmarks moved {shift:.3f} inter-ocular distances on average over "
                f"{d['n_landmark_pairs']} faces (pose and expression kept"
                + (f"; max {lim})" if lim is not None else ")"),
                {"mean_landmark_shift": shift, "n_faces": d["n_landmark_pairs"]},
            )
        )
    return out


def faces_present(data: ImageDataset, policy: AuditPolicy) -> tuple[bool, dict[str, Any]]:
    """Whether the data set holds faces: images of at least MIN_FACE_IMAGE pixels a side, the
    detector finding one in at least half of `face_probe` images drawn from it (the rule of
    `face_reidentification = "auto"`)."""
    if min(data.image_shape[:2]) < MIN_FACE_IMAGE:
        return False, {"probed": 0, "with_a_face": 0, "reason": "images too small for faces"}
    rng = np.random.default_rng(policy.seed)
    idx = sample_idx(len(data), policy.face_probe, rng)
    found = sum(bool(fm.detect(data.images[int(i)])) for i in idx)
    return 2 * found >= len(idx), {"probed": len(idx), "with_a_face": found}


def run_face_reid(
    images: np.ndarray,
    sources: list[np.ndarray] | None,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    policy: AuditPolicy,
) -> list[CheckResult]:
    embedder = fm.embedder(policy.face_embedder)
    numbers = (
        compute_paired(images, sources, sensitive, policy, embedder)
        if sources is not None
        else compute_unpaired(images, sensitive, heldout, policy, embedder)
    )
    return check_face_reid(numbers, policy)
