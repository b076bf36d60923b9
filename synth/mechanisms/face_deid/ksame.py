"""The k-Same-M run of face-deid (`replacement = "average"`): two passes over the photographs.

1. survey (per photo, `survey_photo`): every face's mesh, head pose, texture in the mesh's atlas
   (lighting out) and its embedding by each searched recogniser;
2. on the coordinator: who is who (`clusters.people`: faces some searched recogniser verifies are
   one person), clusters of k distinct people within a pose neighbourhood (`clusters.clusters`),
   each cluster's mean texture and shape. Fewer than k people in the release: the run stops here,
   before anything is drawn;
3. render (per photo, `render_photo`): each face replaced by its cluster's face, judged by the
   searched recognisers as the DCGAN search's candidates are (dlib stays held out); a face that
   no candidate moves past the targets, or that no cluster fits (turned past `max_yaw`), gets the
   DCGAN search instead, flagged; too small a face is pixelated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from accounting.errors import DataFormatError, InvalidParameterError
from synth.mechanisms.face_deid import average as avg
from synth.mechanisms.face_deid import clusters as cl
from synth.mechanisms.face_deid.anonymise import (
    FaceOutcome,
    Window,
    anonymise_face,
    judge,
    pixelate,
    references_of,
)
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.models import no_face_refused, photo_seed, tools_for
from synth.tools import face_mesh as fmesh
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr


@dataclass(frozen=True)
class SurveyedFace:
    """One face as the survey saw it (internal: computed from the sensitive photo)."""

    face: fm.Face
    points: np.ndarray | None  # 468 x 3 mesh in the photo; None: too small to replace
    pose: fmesh.Pose | None
    unwrapped: avg.Unwrapped | None
    embeddings: tuple[np.ndarray | None, ...]  # per searched recogniser
    anchor: np.ndarray | None = None  # YuNet's 5 points of the original, in its window

    @property
    def yaw_pitch(self) -> tuple[float, float]:
        return self.pose.yaw_pitch if self.pose is not None else (90.0, 0.0)


@dataclass(frozen=True)
class Surveyed:
    faces: tuple[SurveyedFace, ...]
    withheld: str | None = None


@dataclass(frozen=True)
class FaceJob:
    """What rendering one face needs from the coordinator: its cluster's face (with a donor
    pool: its donor sets' faces, the first tried first), or None (the fallback, for `missing`)."""

    cluster: int | None
    mean: avg.Unwrapped | None
    alternatives: tuple[avg.Unwrapped, ...] = ()
    missing: str = "no cluster of k people in its pose"

    @property
    def faces(self) -> tuple[avg.Unwrapped, ...]:
        return () if self.mean is None else (self.mean, *self.alternatives)


def searched(config: FaceDeidConfig) -> tuple[fr.Recogniser, ...]:
    return tuple(fr.recogniser(k) for k in config.recognisers)


def prepare_average(config: FaceDeidConfig) -> None:
    """The public models of an averaged run, loaded (the mesh, its template, the detectors and
    the searched recognisers): a missing file fails here, refunded."""
    fmesh.template(config.texture_size)
    for rec in searched(config):
        rec.sightings(np.zeros((64, 64, 3), np.uint8))


def survey_photo(config: FaceDeidConfig, item: tuple[int, np.ndarray]) -> Surveyed:
    """Pass 1, one photo (the per-item function): every face's mesh, pose, atlas texture and
    embeddings."""
    index, photo = item
    photo = np.ascontiguousarray(photo)
    faces = fm.detect(photo, config.detection_threshold)
    if not faces:
        if config.no_face == "refuse":
            raise no_face_refused(index)
        return Surveyed((), "no face detected")
    if len(faces) > config.max_faces_per_photo:
        raise DataFormatError(
            f"photo {index} has {len(faces)} detected faces, more than "
            f"max_faces_per_photo = {config.max_faces_per_photo}. Raise the limit or remove "
            "the photo."
        )
    tpl = fmesh.template(config.texture_size)
    recs = searched(config)
    out = []
    for face in faces:
        window = Window.of(face.box, photo.shape)
        refs, anchor = references_of(photo, window, recs)
        side = min(face.box[2] - face.box[0], face.box[3] - face.box[1])
        if side < config.min_face_size:
            out.append(SurveyedFace(face, None, None, None, refs, anchor))
            continue
        mesh = fmesh.mesh(photo, face.landmarks)
        pose = fmesh.fit_pose(tpl.shape[: fmesh.N_POINTS], mesh)
        points = fmesh.full(mesh, pose)
        unwrapped = avg.unwrap_face(photo, points, pose, tpl, config.shading_sigma)
        out.append(SurveyedFace(face, points, pose, unwrapped, refs, anchor))
    return Surveyed(tuple(out))


@dataclass(frozen=True)
class Grouping:
    """The coordinator's decisions: every face's person and cluster, and each cluster's face."""

    keys: list[cl.FaceKey]
    persons: list[int]
    members: list[list[int]]  # per cluster, indices into keys
    means: list[avg.Unwrapped]

    @property
    def n_people(self) -> int:
        return len(set(self.persons))

    def jobs(self, photo: int, n_faces: int) -> tuple[FaceJob, ...]:
        where = {(k.photo, k.face): i for i, k in enumerate(self.keys)}
        cluster_of = {m: c for c, ms in enumerate(self.members) for m in ms}
        out = []
        for f in range(n_faces):
            c = cluster_of.get(where.get((photo, f), -1))
            out.append(FaceJob(c, None if c is None else self.means[c]))
        return tuple(out)

    def record(self) -> list[list[list[int]]]:
        """Per cluster, its members as [photo, face] (internal: the audit's donor check)."""
        return [[[self.keys[m].photo, self.keys[m].face] for m in ms] for ms in self.members]


def group(config: FaceDeidConfig, surveyed: list[Surveyed]) -> Grouping:
    """People, clusters and their mean faces; fewer than k people is refused (nothing drawn)."""
    recs = searched(config)
    keys, faces = [], []
    for p, s in enumerate(surveyed):
        for f, face in enumerate(s.faces):
            keys.append(cl.FaceKey(p, f))
            faces.append(face)
    persons = cl.people(
        [f.embeddings for f in faces], [r.threshold for r in recs], [r.distances for r in recs]
    )
    n_people = len(set(persons))
    if n_people < config.k:
        raise InvalidParameterError(
            f"[face-deid] the release holds {n_people} distinct "
            f"{'person' if n_people == 1 else 'people'} ({len(faces)} faces; faces the searched "
            f"recognisers verify as one person count once), fewer than k = {config.k}: no "
            f"cluster of {config.k} different people can be averaged, so no face was replaced. "
            "Lower k (at least 2), add photographs of other people, or set "
            'replacement = "generated".'
        )
    usable = [i for i, f in enumerate(faces) if f.unwrapped is not None]
    poses = np.array([faces[i].yaw_pitch for i in usable]).reshape(-1, 2)
    found = cl.clusters(
        poses, [persons[i] for i in usable], config.k, config.max_yaw, config.pose_spread
    )
    members = [[usable[i] for i in c] for c in found]
    means = [
        avg.mean_face([u for m in ms if (u := faces[m].unwrapped) is not None]) for ms in members
    ]
    return Grouping(keys, persons, members, means)


def render_photo(
    config: FaceDeidConfig, item: tuple[int, np.ndarray, Surveyed, tuple[FaceJob, ...]]
) -> tuple[np.ndarray, tuple[FaceOutcome, ...]]:
    """Pass 2, one photo: each face replaced (its cluster's face, else the fallback)."""
    index, photo, surveyed, jobs = item
    photo = np.ascontiguousarray(photo)
    seed = photo_seed(config, index)
    rng = np.random.default_rng(seed)
    work, done = photo.copy(), []
    for face, job in zip(surveyed.faces, jobs, strict=True):
        if face.points is None:
            work = pixelate(work, face.face.box)
            done.append(FaceOutcome(face.face.box, "pixelated-small", None, None, 0, None))
            continue
        result = None if job.mean is None else _averaged(config, work, photo, face, job, rng)
        if result is None:  # no cluster, or no candidate far enough: the DCGAN's search, flagged
            why = job.missing if job.mean is None else "too close"
            work, outcome = anonymise_face(
                work, photo, face.face, tools_for(config), torch.Generator().manual_seed(seed)
            )
            done.append(_flagged(outcome, why))
        else:
            work, outcome = result
            done.append(outcome)
    return work, tuple(done)


def _flagged(outcome: FaceOutcome, why: str) -> FaceOutcome:
    return FaceOutcome(
        outcome.box,
        outcome.method,
        outcome.distance,
        outcome.landmark_shift,
        outcome.candidates,
        outcome.inversion_loss,
        fallback=why,
    )


def _averaged(
    config: FaceDeidConfig,
    work: np.ndarray,
    original: np.ndarray,
    face: SurveyedFace,
    job: FaceJob,
    rng: np.random.Generator,
) -> tuple[np.ndarray, FaceOutcome] | None:
    """The face replaced by its cluster's (or its donor sets', in order): the first factor (strict:
    1 only) whose rendering every searched recogniser puts past its target, else the farthest if
    it is past halfway; None: no candidate is."""
    assert face.points is not None and face.pose is not None and face.unwrapped is not None
    assert job.mean is not None
    recs = searched(config)
    targets = config.targets(recs)
    halfway = tuple((r.threshold + t) / 2 for r, t in zip(recs, targets, strict=True))
    tpl = fmesh.template(config.texture_size)
    window = Window.of(face.face.box, work.shape)
    refs, anchor = face.embeddings, face.anchor  # the survey's, of the same original
    factors = (1.0,) if config.geometry == "strict" else config.attribute_factors
    farthest: tuple[float, Any, np.ndarray, float] | None = None
    tries = [(mean, factor) for mean in job.faces for factor in factors]
    for tried, (mean, factor) in enumerate(tries, 1):
        rendered = avg.posed_shape(face.unwrapped.shape, mean.shape, factor, face.pose)
        candidate = avg.render_face(
            work,
            face.points,
            rendered,
            mean.detail,
            tpl,
            config.shading_sigma,
            config.erode,
            rng,
        )
        judged = judge(candidate, window, refs, anchor, recs)
        if judged.passes(targets):
            return candidate, _outcome(face, judged, tried, job, factor)
        worst = min(d / t for d, t in zip(judged.distances, targets, strict=True))
        if farthest is None or worst > farthest[0]:
            farthest = (worst, judged, candidate, factor)
    if farthest is not None and farthest[1].passes(halfway):
        return farthest[2], _outcome(face, farthest[1], len(tries), job, farthest[3])
    return None


def _outcome(
    face: SurveyedFace, judged: Any, tried: int, job: FaceJob, factor: float
) -> FaceOutcome:
    finite = [d for d in judged.distances if np.isfinite(d)]
    shift = judged.shift if np.isfinite(judged.shift) else None
    return FaceOutcome(
        face.face.box,
        "averaged",
        round(min(finite), 4) if finite else None,
        None if shift is None else round(shift, 4),
        tried,
        None,
        cluster=job.cluster,
        factor=factor,
    )
