"""face-deid's k-Same-M path, piece by piece on real photographs: the dense mesh lands on the face,
the atlas warp is invertible (a face unwrapped and drawn back is itself), people are counted once
however many photos they are in, clusters hold k distinct people in a pose neighbourhood, and a
release with fewer than k people is refused (at plan when the dataset cannot hold them, else
before any face is drawn)."""

from __future__ import annotations

import numpy as np
import pytest

from accounting.errors import InvalidParameterError
from synth.mechanisms.face_deid import average as avg
from synth.mechanisms.face_deid import clusters as cl
from synth.mechanisms.face_deid import ksame
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.run import MECHANISM
from synth.registry import DatasetInfo
from synth.tools import face_mesh as fmesh
from synth.tools import face_models as fm
from tests.support import face_photos


@pytest.fixture(scope="module")
def astronaut() -> tuple[np.ndarray, fm.Face, np.ndarray]:
    photo = face_photos.astronaut()
    face = fm.detect(photo)[0]
    return photo, face, fmesh.mesh(photo, face.landmarks)


def test_the_mesh_lands_on_the_face(astronaut) -> None:
    photo, face, points = astronaut
    assert points.shape == (468, 3)
    x0, y0, x1, y1 = face.box
    inside = (
        (points[:, 0] > x0 - 5) & (points[:, 0] < x1 + 5) & (points[:, 1] > y0 - 5)
        & (points[:, 1] < y1 + 5)
    )  # fmt: skip
    assert inside.mean() > 0.97
    # its outer eye corners are dlib's (points 37 and 46), within a tenth of the eye distance
    iod = fm.inter_ocular(face.landmarks)
    for mesh_i, dlib_i in ((33, 36), (263, 45)):
        assert np.linalg.norm(points[mesh_i, :2] - face.landmarks[dlib_i]) < 0.1 * iod


def test_the_template_is_symmetric_and_its_triangles_face_the_camera() -> None:
    tpl = fmesh.template(128)
    n = len(tpl.shape)  # the 468 points and the ring around the oval
    assert n == 468 + len(fmesh.face_oval())
    assert (tpl.mirror[tpl.mirror] == np.arange(n)).all()
    mirrored = tpl.shape[tpl.mirror] * np.array([-1.0, 1.0, 1.0])
    assert np.abs(mirrored - tpl.shape).max() < 1e-9
    assert (fmesh.facing(tpl.shape, tpl.triangles) > 0).mean() > 0.95
    assert len(tpl.triangles) >= 880  # the tessellation and the filled eyes and mouth
    assert 0.5 < tpl.inside.mean() < 0.8


def test_a_face_unwrapped_and_drawn_back_on_its_own_mesh_is_itself(astronaut) -> None:
    photo, _, mesh = astronaut
    tpl = fmesh.template(192)
    points = fmesh.full(mesh, fmesh.fit_pose(tpl.shape[:468], mesh))
    assert np.abs(points[:468] - mesh).max() < 1e-6  # the ring is added, the mesh kept
    tex, seen = fmesh.unwrap(photo, points, tpl)
    region = avg.region_of([points], photo.shape)
    where, covered = fmesh.render_map(points, tpl, region, min_facing=0.3)
    import cv2

    drawn = cv2.remap(tex, where[..., 0], where[..., 1], cv2.INTER_LINEAR)
    x0, y0, x1, y1 = region
    original = photo[y0:y1, x0:x1].astype(np.float32) / 255.0
    error = np.abs(drawn - original)[covered].mean()
    assert covered.sum() > 5000 and error < 0.03  # interpolation only
    assert seen[tpl.inside].mean() > 0.5


def test_people_are_counted_once_across_photos() -> None:
    def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.array([float(np.linalg.norm(a - b))])

    e = [np.array([0.0]), np.array([0.1]), np.array([5.0]), None, np.array([9.0])]
    # face 0 and 1 are verified as one person; 3 is seen by no recogniser: a person of its own
    assert cl.people([(x,) for x in e], [0.5], [distance]) == [0, 0, 1, 2, 3]


def test_clusters_hold_k_distinct_people_in_a_pose_neighbourhood() -> None:
    poses = np.array([[0, 0], [5, 0], [-5, 0], [10, 0], [2, 0], [-8, 0], [40, 0], [80, 0]])
    persons = [0, 0, 1, 2, 3, 4, 5, 6]  # faces 0 and 1 are one person in two photos
    found = cl.clusters(poses, persons, k=3, max_yaw=60, max_spread=45)
    for c in found:
        assert len({persons[m] for m in c}) == len(c) >= 3  # no person twice in a cluster
    placed = sorted(m for c in found for m in c)
    assert 7 not in placed  # turned past max_yaw: the fallback
    assert placed == [0, 1, 2, 3, 4, 5, 6]
    # five people cannot make two clusters of three: the leftovers joined one
    assert sorted(len(c) for c in found) == [3, 4]
    assert cl.clusters(poses[:2], persons[:2], k=2, max_yaw=60, max_spread=45) == []


def _info(n: int) -> DatasetInfo:
    return DatasetInfo("ds-1", "faces", n, (0,), (192, 192, 3), 1e-5)


def test_the_plan_refuses_a_dataset_that_cannot_hold_k_people() -> None:
    cfg = FaceDeidConfig(max_faces_per_photo=1)
    with pytest.raises(InvalidParameterError, match=r"needs k = 5 distinct people.*at most 4"):
        MECHANISM.plan(cfg, _info(4), [], None)
    # four photos may hold nine people (a group photo): planned, counted at run time
    plan = MECHANISM.plan(FaceDeidConfig(), _info(4), [], None)
    assert any("k-Same-M" in c for c in plan.detail["choices"])
    assert any("face_landmark.tflite" in f for f in plan.detail["bound_files"])
    # the DCGAN search needs no other people
    MECHANISM.plan(
        FaceDeidConfig(replacement="generated", max_faces_per_photo=1), _info(1), [], None
    )


def test_fewer_than_k_people_stop_the_run_before_any_face_is_drawn() -> None:
    cfg = FaceDeidConfig()
    photos = [face_photos.astronaut(), face_photos.grace_hopper(), face_photos.two_faces()]
    surveyed = [ksame.survey_photo(cfg, (i, p)) for i, p in enumerate(photos)]
    assert [len(s.faces) for s in surveyed] == [1, 1, 2]
    with pytest.raises(
        InvalidParameterError, match=r"holds 2 distinct people \(4 faces.*fewer than k = 5"
    ):
        ksame.group(cfg, surveyed)
    # with k = 2: two clusters, each of both people (a person's two photos in different ones)
    grouping = ksame.group(cfg.with_(k=2), surveyed)
    assert grouping.n_people == 2 and [len(m) for m in grouping.members] == [2, 2]
    for members in grouping.members:
        assert len({grouping.persons[m] for m in members}) == 2
    jobs = grouping.jobs(2, 2)
    assert all(j.mean is grouping.means[j.cluster] for j in jobs if j.cluster is not None)
    assert sorted(x for c in grouping.record() for x in c) == [[0, 0], [1, 0], [2, 0], [2, 1]]


def test_the_card_states_the_k_same_bound_and_its_limits() -> None:
    from synth import registry

    params = {
        "replacement": "average",
        "k": 5,
        "geometry": "strict",
        "cluster_sizes": [5, 6],
        "n_faces_fallback": 1,
        "fallback_reasons": ["no cluster of k people in its pose"],
        "people_counted_by": "the searched recognisers' similarity (sface, facenet)",
        "search_targets": {"sface": 0.85},
    }
    about = registry.describe("face-deid", params, {"type": "empirical"}, 4)
    assert "at least k = 5 different people" in about.what and "2 cluster(s) of 5, 6" in about.what
    assert "1 face(s) no cluster fitted were given a DCGAN face" in about.what
    assert "at most 1/k = 1/5" in about.guarantee and "hair, ears, outline" in about.guarantee
    loose = registry.describe("face-deid", {**params, "geometry": "attribute"}, {}, 4)
    assert "empirical only" in loose.guarantee and "1/k" not in loose.guarantee
