"""The face re-identification attack on known cases (real portraits), by every recogniser: no
anonymisation is caught by each, pixelation by none of them significantly, a recogniser the
mechanism never measured still fails a release; the statistics (binomial test, KID) against
independent computations; the realism checks; when the audit runs it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accounting.errors import InvalidParameterError
from audit import AuditInputs, AuditPolicy, run_audit
from audit.face_policy import FacePolicy
from audit.face_reid import (
    CHECK,
    GEOMETRY_CHECK,
    KID_CHECK,
    RETENTION_CHECK,
    SHARPNESS_CHECK,
    FaceReidNumbers,
    check_face_reid,
    check_name,
    compute_paired,
    compute_unpaired,
    faces_present,
    kid,
    pixelate_face,
    rank1_p_value,
    run_face_reid,
    threshold_at_far,
    verification,
)
from synth.kinds.datasets import ImageDataset, uci_digits
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr
from tests.support import face_photos

POLICY = AuditPolicy.from_dict({"face_samples": 50})
KEYS = ("dlib", "sface", "facenet")


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


def _own(originals: ImageDataset) -> list[np.ndarray]:
    return [np.array([i]) for i in range(len(originals))]


@pytest.fixture(scope="module")
def unchanged(originals) -> dict:
    """The originals released as they are, judged by every recogniser (searched: dlib only)."""
    results = run_face_reid(
        originals.images.copy(), _own(originals), originals, None, POLICY, ["dlib"]
    )
    return {r.name: r for r in results}


@pytest.fixture(scope="module")
def pixelated(originals) -> dict:
    """Every face YuNet finds pixelated (8 blocks across its box)."""
    images = []
    for image in originals.images:
        for row in fr.yunet_detect(image):
            x, y, w, h = row[:4]
            image = pixelate_face(image, (x, y, x + w, y + h))
        images.append(image)
    results = run_face_reid(np.stack(images), _own(originals), originals, None, POLICY, ["sface"])
    return {r.name: r for r in results}


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
    # a face the recogniser never found is not accepted, and has no distance to report
    lost = verification(np.array([0.1, np.inf]), impostor, 0.6)
    assert lost["tar_at_threshold"] == 0.5 and lost["median_genuine_distance"] == 0.1


@pytest.mark.parametrize(
    ("hits", "trials", "chance"), [(4, 4, 0.25), (3, 4, 0.25), (2, 9, 1 / 9), (0, 5, 0.2)]
)
def test_rank1_p_value_is_the_binomial_tail(hits: int, trials: int, chance: float) -> None:
    tail = sum(
        math.comb(trials, k) * chance**k * (1 - chance) ** (trials - k)
        for k in range(hits, trials + 1)
    )
    assert rank1_p_value(hits, trials, chance) == pytest.approx(tail, rel=1e-9)
    assert rank1_p_value(0, 0, 0.5) is None


def _paired(key: str, hits: int, trials: int, chance: float, tar: float) -> FaceReidNumbers:
    return FaceReidNumbers(
        "paired",
        {
            "recogniser": key,
            "threshold": 0.6,
            "far_at_threshold": 0.0,
            "tar_at_far_0.001": tar,
            "reidentification_rate": tar,
            "rank1_identification": hits / trials,
            "rank1_hits": hits,
            "rank1_trials": trials,
            "rank1_chance": chance,
            "rank1_p_value": rank1_p_value(hits, trials, chance),
        },
    )


def test_the_rank1_decision_is_the_binomial_test_at_alpha() -> None:
    # 3 of 4 at chance 1/4: tail 13/256 = 0.0508, just above 0.05; 4 of 4: 1/256
    (near,) = check_face_reid(_paired("sface", 3, 4, 0.25, 0.0), POLICY)
    (caught,) = check_face_reid(_paired("sface", 4, 4, 0.25, 0.0), POLICY)
    assert near.passed is True and "p = 0.051" in near.summary
    assert caught.passed is False and "identified above chance" in caught.summary
    # informational rank-1 (alpha omitted): only verification gates
    for off in (None, 0.0):  # 0: what TOML can say (no p-value is below it)
        (free,) = check_face_reid(
            _paired("sface", 4, 4, 0.25, 0.0), AuditPolicy.from_dict({"face_rank1_alpha": off})
        )
        assert free.passed is True


def test_a_recogniser_the_mechanism_never_measured_fails_the_release() -> None:
    """dlib (searched against) neither verifies nor identifies above chance; SFace, held out, picks
    7 of 9 released faces out of a gallery of 9: the release fails on SFace alone."""
    dlib, sface = check_face_reid(
        [_paired("dlib", 1, 9, 1 / 9, 0.0), _paired("sface", 7, 9, 1 / 9, 0.0)],
        POLICY,
        ["dlib"],
    )
    assert dlib.name == check_name("dlib") and dlib.passed is True
    assert dlib.summary.startswith("dlib, searched against:")
    assert sface.name == "face_reidentification[sface]" and sface.passed is False
    assert "held out (the mechanism never measured it)" in sface.summary
    assert sface.details["role"].startswith("held out")


def test_kid_is_the_unbiased_polynomial_mmd() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), rng.normal(0.5, 1.0, size=(5, 4))

    def k(a: np.ndarray, b: np.ndarray) -> float:
        return float((a @ b / 4 + 1) ** 3)

    xx = sum(k(x[i], x[j]) for i in range(6) for j in range(6) if i != j) / 30
    yy = sum(k(y[i], y[j]) for i in range(5) for j in range(5) if i != j) / 20
    xy = sum(k(a, b) for a in x for b in y) / 30
    assert kid(x, y) == pytest.approx(xx + yy - 2 * xy, rel=1e-12)
    assert kid(x[:1], y) is None  # no pairs within x: no unbiased estimate


def test_no_anonymisation_is_re_identified_by_every_recogniser(unchanged) -> None:
    for key in KEYS:
        r = unchanged[check_name(key)]
        d = r.details
        assert r.passed is False, key
        assert d["rank1_hits"] == d["rank1_trials"] == 4, key  # 4 of 4 faces, each its own
        assert d["rank1_chance"] == pytest.approx(0.25) and d["rank1_p_value"] < 0.05, key
        assert d["tar_at_threshold"] == 1.0 and d["n_impostor"] == 6, key
    assert unchanged[check_name("dlib")].details["role"] == "searched against"
    assert "held out" in unchanged[check_name("facenet")].summary
    assert unchanged[check_name("dlib")].details["mean_landmark_shift"] == 0.0


def test_an_unchanged_release_is_as_real_as_the_originals(unchanged) -> None:
    kept, geometry, realism = (unchanged[n] for n in (RETENTION_CHECK, GEOMETRY_CHECK, KID_CHECK))
    assert kept.passed is True and kept.details["detection_retention"] == 1.0
    assert kept.details["n_replaced_faces"] == 4
    assert geometry.passed is True and geometry.details["mean_landmark_shift"] == 0.0
    assert geometry.details["mean_landmark_shift_dlib68"] == 0.0
    d = realism.details
    # identical sets: the unbiased estimate is -2/n (mean k(x, x) - mean k(x, y), x != y), at
    # most 0 (with 4 faces as large as blur's KID: hence n in the report)
    assert realism.passed is True and d["kid_release"] <= 0 < d["kid_blurred"]
    assert d["kid_pixelated"] > 0 and d["kid_n_faces"] == 4


def test_a_pixelated_release(pixelated) -> None:
    """Pixelation (8 blocks across each face) is identified by no recogniser above chance, but it
    is no longer a face to YuNet, and its KID is no better than blurring."""
    for key in KEYS:
        d = pixelated[check_name(key)].details
        assert d["rank1_p_value"] > 0.05 and d["rank1_hits"] <= 1, key
    # SFace (the one searched against here) verifies none; the held-out ones still verify one
    # face (the small one), which fails the release
    assert pixelated[check_name("sface")].passed is True
    assert pixelated[check_name("sface")].details["tar_at_threshold"] == 0.0
    assert pixelated[check_name("dlib")].passed is False
    assert "held out" in pixelated[check_name("dlib")].summary
    kept, realism = pixelated[RETENTION_CHECK], pixelated[KID_CHECK]
    assert kept.passed is False and kept.details["detection_retention"] <= 0.25
    assert pixelated[GEOMETRY_CHECK].passed is False
    assert realism.passed is False and realism.details["kid_release"] > 0


def test_someone_elses_face_is_not(originals) -> None:
    swapped = originals.images[[1, 0]]  # record 0 "released" as Grace Hopper and vice versa
    n = compute_paired(swapped, _own(originals)[:2], originals, POLICY, fm.embedder("dlib"))
    assert n.details["tar_at_threshold"] == 0.0 and n.details["rank1_identification"] == 0.0
    assert n.details["mean_landmark_shift"] is None  # different framing: no same-place pairs


def test_unpaired_match_rate_against_held_out(originals) -> None:
    train = ImageDataset(originals.images[:1], np.zeros(1, np.int64), ["photo"], "train")
    held = ImageDataset(originals.images[1:2], np.zeros(1, np.int64), ["photo"], "held")
    for key in KEYS:
        rec = fr.recogniser(key)
        copies = compute_unpaired(originals.images[:1], train, held, POLICY, rec)
        assert copies.details["match_rate_training"] == 1.0 and copies.rate == 1.0, key
        others = compute_unpaired(originals.images[1:2], train, held, POLICY, rec)
        assert others.details["match_rate_training"] == 0.0 and others.rate == 0.0, key


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
    policy = AuditPolicy.from_dict({"face_samples": 50, "min_utility_gain": 0.0, "fid_samples": 10})
    report = run_audit(_inputs(originals, originals.images.copy(), "empirical"), policy)
    verdicts = report.verdicts()
    assert all(verdicts[check_name(k)] == "fail" for k in KEYS)
    assert verdicts["memorisation_dcr"] == "info" and not report.passed


def test_an_empirical_release_without_its_attack_fails(originals) -> None:
    from audit.run import _attacks

    images = originals.images.copy()  # "released" unchanged: the attack must catch it
    policy = AuditPolicy.from_dict(
        {"face_samples": 50, "face_recognisers": ["dlib"]}
    )  # as TOML gives it
    results = _attacks(_inputs(originals, images, "empirical"), images, policy, None)
    assert [r.name for r in results] == [
        check_name("dlib"),
        RETENTION_CHECK,
        GEOMETRY_CHECK,
        KID_CHECK,
        SHARPNESS_CHECK,
    ]
    assert results[0].passed is False and all(r.passed for r in results[1:4])
    # sharpness is reported, not gated: an unchanged face is exactly as sharp as its original
    assert results[4].passed is None and results[4].details["mean_sharpness_ratio"] == 1.0

    off = AuditPolicy.from_dict({"face_reidentification": "off"})
    (result,) = _attacks(_inputs(originals, images, "empirical"), images, off, None)
    assert result.name == CHECK and result.passed is False
    assert 'face_reidentification = "off"' in result.summary
    # a DP or k-anonymous release of the same data simply runs without it
    assert _attacks(_inputs(originals, images, "dp"), images, off, None)[-1].name != CHECK


def test_an_embedder_named_by_an_older_spec_attacks_too(originals, monkeypatch) -> None:
    class Renamed(fm.DlibEmbedder):  # a user's embedder, registered under its own name
        name = "my embedder"

    monkeypatch.setitem(fm.EMBEDDERS, "mine", Renamed)
    policy = AuditPolicy.from_dict(
        {"face_samples": 50, "face_recognisers": ("sface",), "face_embedder": "mine"}
    )
    results = run_face_reid(originals.images[:2], _own(originals)[:2], originals, None, policy)
    names = [r.name for r in results if r.kind == "attack"]
    assert names == [check_name("sface"), check_name("mine")]
    assert all(r.passed is False for r in results if r.kind == "attack")


def test_policy_values_are_checked() -> None:
    with pytest.raises(InvalidParameterError, match="face_reidentification must be one of"):
        AuditPolicy.from_dict({"face_reidentification": "sometimes"})
    with pytest.raises(InvalidParameterError, match="between 0 and 1"):
        AuditPolicy.from_dict({"face_max_verification_rate": 1.5})
    with pytest.raises(InvalidParameterError, match="between 0 and 1"):
        AuditPolicy.from_dict({"face_min_detection_retention": 2.0})
    with pytest.raises(InvalidParameterError, match="positive integer"):
        AuditPolicy.from_dict({"face_samples": 0})
    with pytest.raises(InvalidParameterError, match="face_max_landmark_shift must be >= 0"):
        AuditPolicy.from_dict({"face_max_landmark_shift": -1.0})
    with pytest.raises(InvalidParameterError, match="face_max_landmark_shift_strict must be >= 0"):
        AuditPolicy.from_dict({"face_max_landmark_shift_strict": -0.1})
    with pytest.raises(InvalidParameterError, match="unknown recogniser.*arcface"):
        AuditPolicy.from_dict({"face_recognisers": ["dlib", "arcface"]})
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        AuditPolicy.from_dict({"face_recognisers": []})
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        AuditPolicy.from_dict({"face_recognisers": "sface"})
    with pytest.raises(InvalidParameterError, match="face_rank1_alpha must be at least 0"):
        AuditPolicy.from_dict({"face_rank1_alpha": 1.0})
    with pytest.raises(InvalidParameterError, match="face_max_kid_vs_blur must be true or false"):
        AuditPolicy.from_dict({"face_max_kid_vs_blur": 1})
    policy = AuditPolicy.from_dict({"face_recognisers": ["sface", "dlib", "sface"]})
    assert policy.section(FacePolicy).face_recognisers == ("sface", "dlib")


def test_k_anonymous_and_dp_releases_of_faces_get_the_attack_too(originals) -> None:
    """With face_reidentification = "auto" the audit finds faces in the sensitive set and runs the
    attack beside each kind's own attacks, so the mechanisms meet on one table; the realism checks
    are only for faces that stay in place."""
    from audit.run import _attacks

    average = originals.images[:2].astype(np.float64).mean(0).astype(np.uint8)[None]
    kanon = _inputs(originals, average, "k-anonymity", k=2)
    kanon.clusters = [np.array([0, 1])]
    names = [r.name for r in _attacks(kanon, average, POLICY, None)]
    assert names[-3:] == [check_name(k) for k in KEYS] and "kanon_cluster_membership" in names
    assert RETENTION_CHECK not in names
    dp = _inputs(originals, originals.images[:1], "dp")
    dp.clusters = None
    results = _attacks(dp, originals.images[:1], POLICY, None)
    for key in KEYS:
        face = next(r for r in results if r.name == check_name(key))
        assert face.details["mode"] == "unpaired" and face.details["match_rate_training"] == 1.0


def test_the_card_says_which_recognisers_the_mechanism_searched_against() -> None:
    from release.card import verdict_note

    searched = {"searched_recognisers": ["dlib", fr.recogniser("sface").name]}  # keys or names
    assert verdict_note(check_name("dlib"), searched) == "searched against"
    assert verdict_note(check_name("sface"), searched) == "searched against"
    assert verdict_note(check_name("facenet"), searched).startswith("held out")
    # other mechanisms name none; other checks have no note
    assert verdict_note(check_name("facenet"), {}) == ""
    assert verdict_note(RETENTION_CHECK, searched) == ""


def test_the_two_sample_check_tells_shifted_features_and_not_the_same_ones() -> None:
    from audit.face_reid import two_sample_auc

    rng = np.random.default_rng(0)
    original = rng.normal(size=(20, 16))
    assert two_sample_auc(original, original) <= 0.6  # the same faces: it cannot tell
    assert two_sample_auc(original + 2.0, original) > 0.95  # released faces unlike any original
    assert two_sample_auc(original[:3], original) is None  # too few to say


def test_faces_averaged_in_strict_geometry_are_held_to_their_own_landmark_limit() -> None:
    """k-Same-M's strict geometry gives each face the average's shape, so its landmarks move by
    design: those faces are judged at face_max_landmark_shift_strict (0.08), the others at
    face_max_landmark_shift (0.05), the mean shift against the mean of the faces' limits."""
    from audit.face_reid import check_realism

    realism = {
        "n_replaced_faces": 4,
        "n_retained": 4,
        "detection_retention": 1.0,
        "mean_landmark_shift_yunet5": 0.07,
        "n_landmark_faces": 4,
        "kid_release": None,
        "kid_blurred": None,
        "kid_pixelated": None,
    }
    policy = AuditPolicy()

    def geometry(share: float | None) -> tuple[bool | None, str]:
        (check,) = [
            r for r in check_realism(realism, policy, None, share) if r.name == "face_geometry"
        ]
        return check.passed, check.summary

    passed, summary = geometry(None)
    assert passed is False and "max 0.05)" in summary
    passed, summary = geometry(1.0)
    assert passed and "max 0.08, 100% of them in strict geometry" in summary
    assert geometry(0.5)[0] is False  # half the faces the fallback's: limit 0.065
    loose = AuditPolicy.from_dict({"face_max_landmark_shift_strict": 0.06})
    assert [
        r.passed for r in check_realism(realism, loose, None, 1.0) if r.name == "face_geometry"
    ] == [False]
    # which faces count: face-deid's record, the share averaged in strict geometry
    from synth.mechanisms.face_deid.config import FaceDeidConfig
    from synth.mechanisms.face_deid.run import _strict_share

    params = {"n_faces": 9, "n_faces_averaged": 3}
    assert _strict_share(FaceDeidConfig(), params) == pytest.approx(1 / 3)
    assert _strict_share(FaceDeidConfig(geometry="attribute"), params) == 0.0
    assert _strict_share(FaceDeidConfig(), {"n_faces": 0, "n_faces_averaged": 0}) == 0.0
