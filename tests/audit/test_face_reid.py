"""The face re-identification attack on known cases (real portraits): no anonymisation is caught,
someone else's face is not; the verification arithmetic; when the audit runs it."""

from __future__ import annotations

import numpy as np
import pytest

from accounting.errors import InvalidParameterError
from audit import AuditInputs, AuditPolicy, run_audit
from audit.face_reid import (
    CHECK,
    GEOMETRY_CHECK,
    check_face_reid,
    compute_paired,
    compute_unpaired,
    faces_present,
    threshold_at_far,
    verification,
)
from synth import face_models as fm
from synth.datasets import ImageDataset, uci_digits
from tests.support import face_photos

POLICY = AuditPolicy(face_samples=50)


@pytest.fixture(scope="module")
def originals() -> ImageDataset:
    """Three records: two portraits and the photo with both faces, all 256 x 256."""
    from PIL import Image

    def square(a: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(a).resize((256, 256)))

    images = np.stack(
        [
            square(face_photos.astronaut()),
            square(face_photos.grace_hopper()),
            square(face_photos.two_faces()),
        ]
    )
    return ImageDataset(images, np.zeros(3, np.int64), ["photo"], "portraits")


def test_threshold_at_far_and_tar() -> None:
    impostor = np.linspace(0.5, 1.5, 1000)  # 1000 pairs: FAR 1e-3 allows one false accept
    thr, far = threshold_at_far(impostor, 1e-3)
    assert thr == pytest.approx(impostor[1]) and far == pytest.approx(1e-3)
    thr, far = threshold_at_far(impostor[:10], 1e-3)  # too few pairs: below the closest one
    assert thr == pytest.approx(0.5) and far == 0.0
    v = verification(np.array([0.1, 0.2, 0.7, 0.9]), impostor, 0.6)
    assert v["tar_at_threshold"] == 0.5 and v["far_at_threshold"] == pytest.approx(0.1, abs=1e-3)
    assert v["tar_at_far_0.001"] == 0.5 and v["far_resolution"] == 1e-3
    assert verification(np.zeros(0), np.zeros(0), 0.6)["tar_at_far_0.001"] is None


def test_no_anonymisation_is_re_identified(originals) -> None:
    n = compute_paired(
        originals.images, [np.array([i]) for i in range(3)], originals, POLICY, fm.embedder("dlib")
    )
    d = n.details
    assert d["n_genuine"] == 4 and d["tar_at_threshold"] == 1.0 and n.rate == 1.0
    assert d["rank1_identification"] == 1.0 and d["tar_at_far_0.001"] == 1.0
    assert d["mean_landmark_shift"] == 0.0 and d["n_landmark_pairs"] == 4
    assert d["n_impostor"] == 6  # pairs of the 4 different original faces
    result, geometry = check_face_reid(n, POLICY)
    assert result.name == CHECK and result.passed is False and "TAR 1.000" in result.summary
    assert geometry.name == GEOMETRY_CHECK and geometry.passed is True


def test_someone_elses_face_is_not(originals) -> None:
    swapped = originals.images[[1, 0]]  # record 0 "released" as Grace Hopper and vice versa
    n = compute_paired(
        swapped, [np.array([0]), np.array([1])], originals, POLICY, fm.embedder("dlib")
    )
    assert n.details["tar_at_threshold"] == 0.0 and n.details["rank1_identification"] == 0.0
    assert n.details["mean_landmark_shift"] is None  # different framing: no same-place pairs


def test_unpaired_match_rate_against_held_out(originals) -> None:
    train = ImageDataset(originals.images[:1], np.zeros(1, np.int64), ["photo"], "train")
    held = ImageDataset(originals.images[1:2], np.zeros(1, np.int64), ["photo"], "held")
    copies = compute_unpaired(originals.images[:1], train, held, POLICY, fm.embedder("dlib"))
    assert copies.details["match_rate_training"] == 1.0 and copies.rate == 1.0
    others = compute_unpaired(originals.images[1:2], train, held, POLICY, fm.embedder("dlib"))
    assert others.details["match_rate_training"] == 0.0 and others.rate == 0.0


def test_auto_probes_only_images_that_can_hold_a_face(originals) -> None:
    assert faces_present(originals, POLICY)[0]
    present, why = faces_present(uci_digits().subset(np.arange(20)), POLICY)
    assert not present and why["reason"] == "images too small for faces"


def _inputs(originals, images, kind, **kw) -> AuditInputs:
    return AuditInputs(
        release_id="rel-f",
        images=images,
        labels=np.zeros(len(images), np.int64),
        ids=[f"f-{i}" for i in range(len(images))],
        expected_count=len(images),
        label_set=[0],
        sensitive=originals,
        heldout=None,
        record_fingerprint_key=b"k" * 32,
        mechanism="face-deid",
        guarantee_kind=kind,
        clusters=[np.array([i]) for i in range(len(images))],
        **kw,
    )


@pytest.mark.slow  # a whole audit (expectations, FID): half a minute
def test_an_empirical_release_that_is_the_originals_fails_its_audit(originals) -> None:
    policy = AuditPolicy(face_samples=50, min_utility_gain=0.0, fid_samples=10)
    report = run_audit(_inputs(originals, originals.images.copy(), "empirical"), policy)
    verdicts = report.verdicts()
    assert verdicts[CHECK] == "fail" and verdicts["memorisation_dcr"] == "info"
    assert not report.passed


def test_an_empirical_release_without_its_attack_fails(originals) -> None:
    from audit.run import _attacks

    images = originals.images.copy()  # "released" unchanged: the attack must catch it
    (caught, geometry) = _attacks(_inputs(originals, images, "empirical"), images, POLICY, None)
    assert caught.name == CHECK and caught.passed is False and geometry.passed is True

    off = AuditPolicy(face_reidentification="off")
    (result,) = _attacks(_inputs(originals, images, "empirical"), images, off, None)
    assert result.name == CHECK and result.passed is False
    assert 'face_reidentification = "off"' in result.summary
    # a DP or k-anonymous release of the same data simply runs without it
    assert _attacks(_inputs(originals, images, "dp"), images, off, None)[-1].name != CHECK


def test_policy_values_are_checked() -> None:
    with pytest.raises(InvalidParameterError, match="face_reidentification must be one of"):
        AuditPolicy(face_reidentification="sometimes")
    with pytest.raises(InvalidParameterError, match="between 0 and 1"):
        AuditPolicy(face_max_verification_rate=1.5)
    with pytest.raises(InvalidParameterError, match="positive integer"):
        AuditPolicy(face_samples=0)
    with pytest.raises(InvalidParameterError, match="face_max_landmark_shift must be >= 0"):
        AuditPolicy(face_max_landmark_shift=-1.0)


def test_k_anonymous_and_dp_releases_of_faces_get_the_attack_too(originals) -> None:
    """With face_reidentification = "auto" the audit finds faces in the sensitive set and runs the
    attack beside each kind's own attacks, so the mechanisms meet on one table."""
    from audit.run import _attacks

    average = originals.images[:2].astype(np.float64).mean(0).astype(np.uint8)[None]
    kanon = _inputs(originals, average, "k-anonymity", k=2)
    kanon.clusters = [np.array([0, 1])]
    names = [r.name for r in _attacks(kanon, average, POLICY, None)]
    assert names[-1] == CHECK and "kanon_cluster_membership" in names
    dp = _inputs(originals, originals.images[:1], "dp")
    dp.clusters = None
    results = _attacks(dp, originals.images[:1], POLICY, None)
    face = next(r for r in results if r.name == CHECK)
    assert face.details["mode"] == "unpaired" and face.details["match_rate_training"] == 1.0
