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


def test_a_donor_pool_gives_each_face_the_farthest_donors_near_its_pose() -> None:
    """The steward's donor pool (issue 64): each face's donor sets are pool faces within
    pose_spread of it, the farthest by the searched recognisers first, in sets of pool_donors;
    the release's own people are nobody's donors."""
    from synth.mechanisms.face_deid import pool as face_pool
    from synth.mechanisms.face_deid.pool import DonorPool, donor_sets, group_with_pool

    cfg = FaceDeidConfig(pool_donors=1, pool_sets=3)
    photos = [face_photos.astronaut(), face_photos.grace_hopper(), face_photos.two_faces()]
    surveyed = [ksame.survey_photo(cfg, (i, p)) for i, p in enumerate(photos)]
    target = surveyed[0].faces[0]  # the astronaut
    pair = surveyed[2].faces  # the two-face photo: the astronaut on the left, Grace Hopper right
    left = min(range(2), key=lambda f: pair[f].face.box[0])
    pool = DonorPool(
        (pair[left], surveyed[1].faces[0], pair[1 - left]), ((2, 0), (1, 0), (2, 1)), 2
    )
    sets = donor_sets(cfg, target, pool)
    # her own face in the two-face photo is the nearest, so it comes last; Grace Hopper's two
    # faces (the portrait and its crop) first
    assert sorted(sets[:2]) == [[1], [2]] and sets[2] == [0]
    assert donor_sets(cfg.with_(pool_donors=2), target, pool) == [sets[0] + sets[1]]
    # a face turned beyond pose_spread of every donor gets none (the fallback says why)
    assert donor_sets(cfg.with_(pose_spread=0.0), target, pool) == []
    grouping = group_with_pool(cfg.with_(pose_spread=0.0), surveyed[:1], pool)
    assert grouping.jobs(0, 1)[0].mean is None
    assert grouping.jobs(0, 1)[0].missing == face_pool.NO_POOL_FACE
    # her face in the pool is hers: a data subject lends no face, so two sets are left
    grouping = group_with_pool(cfg, surveyed[:1], pool)
    assert grouping.barred == frozenset({0})
    job = grouping.jobs(0, 1)[0]
    assert job.mean is not None and len(job.faces) == 2
    assert grouping.donors[(0, 0)] == [[pool.places[i] for i in s] for s in sets[:2]]


def test_a_donor_pool_is_refused_unless_the_average_uses_it_and_holds_enough_faces() -> None:
    from PIL import Image

    from synth.kinds.datasets import ImageDataset
    from synth.mechanisms.face_deid.pool import survey_pool

    coffee = np.asarray(Image.fromarray(face_photos.no_face()).resize((512, 512)))
    photos = np.stack([face_photos.astronaut(), coffee])
    pool = ImageDataset(photos, np.zeros(2, np.int64), ["photo"], "photos:/pool")
    with pytest.raises(InvalidParameterError, match=r'used only by replacement = "average"'):
        MECHANISM.plan(FaceDeidConfig(replacement="generated"), _info(4), [], pool)
    # with a pool, the release's own people need not number k: planned with one photo
    plan = MECHANISM.plan(FaceDeidConfig(max_faces_per_photo=1), _info(1), [], pool)
    assert any("donor pool 'photos:/pool'" in c for c in plan.detail["choices"])
    grey = ImageDataset(photos[..., 0], np.zeros(2, np.int64), ["photo"], "photos:/grey")
    with pytest.raises(InvalidParameterError, match="must be colour photographs"):
        MECHANISM.plan(FaceDeidConfig(), _info(4), [], grey)
    # one usable face (the coffee has none) for two donors a face: refused, before the run
    # reads a sensitive photo (the runner calls this before on_sensitive_access)
    with pytest.raises(
        InvalidParameterError, match=r"holds 1 usable face \(2 photographs.*pool_donors = 2"
    ):
        survey_pool(FaceDeidConfig(), pool)
    assert len(survey_pool(FaceDeidConfig(pool_donors=1), pool).faces) == 1


def test_the_card_of_a_donor_pool_release_names_the_pool_and_no_k_same_bound() -> None:
    from synth import registry

    params = {
        "replacement": "average",
        "pool_donors": 2,
        "donor_pool": "photos:/consented",
        "donor_pool_faces": 40,
        "donor_pool_photos": 38,
        "n_faces_fallback": 0,
        "search_targets": {"sface": 0.85},
    }
    about = registry.describe("face-deid", params, {}, 6)
    assert "average face of 2 people of the donor pool 'photos:/consented'" in about.what
    assert "40 faces in 38 photograph(s)" in about.what and "0 of them held back" in about.what
    assert "no k-Same bound" in about.guarantee and "1/k" not in about.guarantee
    assert "No data subject's face is drawn into another's photo" in about.guarantee
