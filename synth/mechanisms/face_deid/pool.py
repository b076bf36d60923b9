"""A public donor pool for the k-Same-M render (`public = "photos:DIR"` in a face-deid spec).

The steward registers consented photographs (people who agreed that their faces, averaged in
twos, appear in place of the data subjects'); each face of the release is then drawn from the
average of `pool_donors` pool faces instead of its cluster's mean, so no data subject's face is
drawn into another subject's photo.

Why a few donors and not k: measured on the nine shipped faces (docs/benchmarks/faces.md, "the
donor pool"), an average of many faces is generic and lets the recognisers fall back on what the
render keeps (hair, outline, the face's own lighting): SFace still picked the right person for 6
of 9 faces from a mean of 8. An average of two other people carries their identity instead (1-2
of 9), which is why those two must be people who consented: the pool, not the release's subjects.

Donors are chosen per face: the pool faces within `pose_spread` of its head pose, those the
searched recognisers put farthest from it first, in sets of `pool_donors`; `pool_sets` sets are
tried in that order by the search (synth.mechanisms.face_deid.ksame), then the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accounting.errors import InvalidParameterError
from synth.kinds.datasets import ImageDataset
from synth.mechanisms.face_deid import average as avg
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.ksame import FaceJob, Surveyed, SurveyedFace, searched, survey_photo

NO_POOL_FACE = "no donor-pool face in its pose"


@dataclass(frozen=True)
class DonorPool:
    """The pool's usable faces (public): each face's survey and its place (photo, face)."""

    faces: tuple[SurveyedFace, ...]
    places: tuple[tuple[int, int], ...]
    n_photos: int
    source: str = ""


def survey_pool(config: FaceDeidConfig, pool: ImageDataset) -> DonorPool:
    """Every face of the pool large enough to unwrap; refused when fewer than `pool_donors`."""
    quiet = config.with_(no_face="withhold")
    faces, places = [], []
    for p, photo in enumerate(pool.images):
        for f, face in enumerate(survey_photo(quiet, (p, photo)).faces):
            if face.unwrapped is not None:
                faces.append(face)
                places.append((p, f))
    if len(faces) < config.pool_donors:
        raise InvalidParameterError(
            f"[face-deid] the donor pool {pool.source!r} holds {len(faces)} usable "
            f"face{'' if len(faces) == 1 else 's'} ({len(pool.images)} photographs; faces under "
            f"min_face_size = {config.min_face_size} px do not count), fewer than pool_donors = "
            f"{config.pool_donors}. Add consented photographs to the pool, or lower pool_donors."
        )
    return DonorPool(tuple(faces), tuple(places), len(pool.images), pool.source)


def _distance(config: FaceDeidConfig, a: SurveyedFace, b: SurveyedFace) -> float:
    """How far apart the searched recognisers put two faces, each in units of its threshold
    (a recogniser that saw either face adds nothing)."""
    total = 0.0
    for r, rec in enumerate(searched(config)):
        x, y = a.embeddings[r], b.embeddings[r]
        if x is not None and y is not None:
            total += float(np.asarray(rec.distances(x, y)).ravel()[0]) / rec.threshold
    return total


def donor_sets(
    config: FaceDeidConfig,
    face: SurveyedFace,
    pool: DonorPool,
    barred: frozenset[int] = frozenset(),
) -> list[list[int]]:
    """The donor sets for one face (indices into the pool, none of `barred`), the farthest donors
    first; none when fewer than `pool_donors` pool faces lie within `pose_spread` of its pose."""
    yaw, pitch = face.yaw_pitch
    near = [
        i
        for i, d in enumerate(pool.faces)
        if i not in barred
        and np.hypot(d.yaw_pitch[0] - yaw, d.yaw_pitch[1] - pitch) <= config.pose_spread
    ]
    near.sort(key=lambda i: (-_distance(config, face, pool.faces[i]), i))
    m = config.pool_donors
    return [near[s : s + m] for s in range(0, len(near) - m + 1, m)][: config.pool_sets]


def subjects_in_pool(
    config: FaceDeidConfig, surveyed: list[Surveyed], pool: DonorPool
) -> frozenset[int]:
    """The pool faces some searched recogniser verifies as a face of the release: a data subject
    who is also in the pool lends no face (else their face would be drawn into others' photos)."""
    subjects = [f for s in surveyed for f in s.faces]
    barred = set()
    for r, rec in enumerate(searched(config)):
        seen = [e for f in subjects if (e := f.embeddings[r]) is not None]
        if not seen:
            continue
        gallery = np.stack(seen)
        for i, donor in enumerate(pool.faces):
            x = donor.embeddings[r]
            if x is not None and (np.asarray(rec.distances(x, gallery)) < rec.threshold).any():
                barred.add(i)
    return frozenset(barred)


@dataclass(frozen=True)
class PoolGrouping:
    """Every face's donor sets (what the card and the run's record say of them)."""

    jobs_by_face: dict[tuple[int, int], FaceJob]
    donors: dict[tuple[int, int], list[list[tuple[int, int]]]]  # per face, its sets' places
    pool: DonorPool
    barred: frozenset[int] = frozenset()  # pool faces verified as a data subject: not used

    def jobs(self, photo: int, n_faces: int) -> tuple[FaceJob, ...]:
        none = FaceJob(None, None, missing=NO_POOL_FACE)
        return tuple(self.jobs_by_face.get((photo, f), none) for f in range(n_faces))


def group_with_pool(
    config: FaceDeidConfig, surveyed: list[Surveyed], pool: DonorPool
) -> PoolGrouping:
    """Each face's donor sets and their average faces (no clusters of the release's people; no
    pool face that is one of them)."""
    barred = subjects_in_pool(config, surveyed, pool)
    jobs, donors = {}, {}
    for p, s in enumerate(surveyed):
        for f, face in enumerate(s.faces):
            if face.unwrapped is None:
                continue
            sets = donor_sets(config, face, pool, barred)
            if not sets:
                continue
            means = [avg.mean_face([pool.faces[i].unwrapped for i in ds]) for ds in sets]  # type: ignore[misc]
            jobs[(p, f)] = FaceJob(None, means[0], tuple(means[1:]), NO_POOL_FACE)
            donors[(p, f)] = [[pool.places[i] for i in ds] for ds in sets]
    return PoolGrouping(jobs, donors, pool, barred)
