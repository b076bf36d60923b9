"""Donor re-identification of a k-Same-M face release (face-deid's `replacement = "average"`).

Each averaged face was made from a cluster of at least k people of the release (its donors: the
cluster's other members). Per recogniser, every released face of a cluster is matched against the
gallery of all original faces of the released photos, as an attacker holding the originals would:

- rank-1: how often the nearest original is one of the face's donors, and, per donor, the share
  of the faces made with them whose nearest original is that donor, against 1/k (a one-sided
  binomial test: a donor chosen more often than 1/k is identifiable through the average);
- verification: whether any donor lies within the recogniser's published same-person threshold.

Computing the numbers (`compute_donor_reid`) is separate from judging them (`judge_donor_reid`),
so the benchmarks reuse the computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr

CHECK = "face_donor_reid"  # one check per recogniser: face_donor_reid[KEY]


@dataclass(frozen=True)
class DonorNumbers:
    """Per recogniser: the released faces matched, their donor rank-1 hits and verifications,
    and the most-identified donor's hits and trials."""

    recogniser: str
    k: int
    n_faces: int  # released faces of clusters the recogniser saw
    donor_rank1_hits: int
    donors_verified: int  # released faces with a donor within the threshold
    worst_donor: tuple[int, int] | None  # (photo, face) of the donor most often rank-1
    worst_hits: int
    worst_trials: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "recogniser": self.recogniser,
            "k": self.k,
            "n_faces": self.n_faces,
            "donor_rank1_hits": self.donor_rank1_hits,
            "donor_rank1_rate": self.donor_rank1_hits / self.n_faces if self.n_faces else None,
            "donors_verified": self.donors_verified,
            "worst_donor_hits": self.worst_hits,
            "worst_donor_trials": self.worst_trials,
            "bound": 1.0 / self.k,
        }


def compute_donor_reid(
    images: np.ndarray,
    sources: Sequence[np.ndarray],
    sensitive: ImageDataset,
    face_clusters: Sequence[Sequence[Sequence[int]]],
    rec: fr.Recogniser,
    k: int,
) -> DonorNumbers:
    """The donor attack's numbers for recogniser `rec`. `face_clusters`: per cluster, its members
    as [photo, face] (photo: the sensitive record; face: its place in the detector's order);
    `sources[r]`: the sensitive record of released photo r."""
    row_of = {int(np.asarray(s).ravel()[0]): r for r, s in enumerate(sources)}
    boxes: dict[tuple[int, int], tuple[float, float, float, float]] = {}
    for p in row_of:
        for f, face in enumerate(fm.detect(sensitive.images[p])):
            boxes[(p, f)] = face.box
    gallery_keys, gallery = [], []
    for key, box in boxes.items():
        seen = rec.at(sensitive.images[key[0]], box)
        if seen is not None:
            gallery_keys.append(key)
            gallery.append(seen.embedding)
    if not gallery:
        return DonorNumbers(rec.key, k, 0, 0, 0, None, 0, 0)
    stacked = np.stack(gallery)
    hits: dict[tuple[int, int], int] = {}
    trials: dict[tuple[int, int], int] = {}
    n = rank1 = verified = 0
    for cluster in face_clusters:
        members = [(int(m[0]), int(m[1])) for m in cluster]
        for me in members:
            if me not in boxes or me[0] not in row_of:
                continue
            seen = rec.at(images[row_of[me[0]]], boxes[me])
            if seen is None:
                continue
            donors = [d for d in members if d != me]
            n += 1
            for d in donors:
                trials[d] = trials.get(d, 0) + 1
            dist = rec.distances(seen.embedding, stacked)
            nearest = gallery_keys[int(np.argmin(dist))]
            if nearest in donors:
                rank1 += 1
                hits[nearest] = hits.get(nearest, 0) + 1
            near = {gallery_keys[i] for i in np.flatnonzero(dist < rec.threshold)}
            verified += bool(near & set(donors))
    worst = max(hits, key=lambda d: (hits[d] / trials[d], hits[d]), default=None)
    return DonorNumbers(
        rec.key,
        k,
        n,
        rank1,
        verified,
        worst,
        hits.get(worst, 0) if worst else 0,
        trials.get(worst, 0) if worst else 0,
    )


def judge_donor_reid(numbers: DonorNumbers, alpha: float | None) -> CheckResult:
    """Fails when a donor is verified, or when the most-identified donor is rank-1 more often than
    1/k (one-sided binomial test at `alpha`)."""
    d = numbers.as_dict()
    name = f"{CHECK}[{numbers.recogniser}]"
    if numbers.n_faces == 0:
        return CheckResult(name, "attack", None, "not run: the recogniser saw no averaged face", d)
    p = _p_value(numbers.worst_hits, numbers.worst_trials, 1.0 / numbers.k)
    d["worst_donor_p_value"] = p
    above = alpha is not None and p is not None and p < alpha
    passed = numbers.donors_verified == 0 and not above
    return CheckResult(
        name,
        "attack",
        passed,
        f"{numbers.donor_rank1_hits} of {numbers.n_faces} averaged faces have a donor as "
        f"{numbers.recogniser}'s rank-1 original; the most-identified donor "
        f"{numbers.worst_hits} of {numbers.worst_trials} (bound 1/k = {1 / numbers.k:.3f}, "
        f"p {'-' if p is None else f'{p:.3f}'}"
        + ("" if alpha is None else f", fails below {alpha:g}")
        + "); "
        + f"{numbers.donors_verified} with a donor verified at its threshold "
        + rec_threshold(numbers),
        d,
    )


def _p_value(hits: int, trials: int, chance: float) -> float | None:
    """One-sided binomial test: at least `hits` of `trials` if each succeeded with `chance`."""
    if trials == 0:
        return None
    from scipy.stats import binomtest

    return float(binomtest(hits, trials, min(max(chance, 0.0), 1.0), alternative="greater").pvalue)


def rec_threshold(numbers: DonorNumbers) -> str:
    return f"{fr.recogniser(numbers.recogniser).threshold:g}"
