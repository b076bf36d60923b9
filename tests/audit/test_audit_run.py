"""run_audit end to end on small real data (UCI digits at 28x28): a clean PrivImage-style release,
bad releases that must be blocked, a k-anonymous release, and missing inputs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from accounting.errors import DataFormatError, InvalidParameterError
from audit import AuditInputs, AuditPolicy, load_report, report_text, run_audit, save_report
from synth.kinds.datasets import ImageDataset, uci_digits

KEY = b"s" * 32
# grid_pairs=2: the nearest-pairs grid is still drawn (and checked), with 2 rows instead of 8
SMALL = AuditPolicy(
    mia_samples=100,
    feature_samples=40,
    fid_samples=40,
    utility_train_samples=200,
    cnn_epochs=1,
    grid_pairs=2,
)
# for tests that assert neither the feature-space numbers, the FID nor the utility
FAST = AuditPolicy.from_dict(
    {**SMALL.to_dict(), "feature_samples": 8, "fid_samples": 8, "utility_train_samples": 50}
)


@pytest.fixture(scope="module")
def parts():
    import torch

    torch.set_num_threads(1)
    d = uci_digits()
    return (
        d.subset(np.arange(0, 600)),
        d.subset(np.arange(600, 900)),
        d.subset(np.arange(900, 1000)),
        d.subset(np.arange(1000, 1100)),
    )


def mean_pixel_loss(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """A 'generator loss' that knows nothing about membership."""
    return images.reshape(len(images), -1).mean(1).astype(np.float64)


def assert_bars_complete(reports: list[tuple[str, int, int]], expected: list[str]) -> None:
    """Every stage's bar ends at its total (a bar left short keeps its clock running: issue 36)."""
    last = {}
    for stage, done, total in reports:
        last[stage] = (done, total)
    assert list(last) == [f"audit: {s}" for s in expected]
    assert all(done == total for done, total in last.values()), last


def _inputs(parts, tmp_path, **kw) -> AuditInputs:
    sens, ho, rel, pub = parts
    args = dict(
        release_id="rel-ok",
        images=rel.images,
        labels=rel.labels,
        ids=[f"img-{i}" for i in range(len(rel))],
        expected_count=len(rel),
        label_set=list(range(10)),
        sensitive=sens,
        heldout=ho,
        record_fingerprint_key=KEY,
        mechanism="privimage",
        claimed_epsilon=2.0,
        delta=1e-5,
        loss_fn=mean_pixel_loss,
        selected_public=pub,
        artifacts_dir=tmp_path / "artifacts",
    )
    args.update(kw)
    return AuditInputs(**args)


def test_clean_release_passes_with_all_checks(parts, tmp_path):
    stages = []
    report = run_audit(
        _inputs(parts, tmp_path), SMALL, progress=lambda s, d, t: stages.append((s, d, t))
    )
    names = {r.name for r in report.results}
    assert {
        "memorisation_dcr",
        "membership_inference",
        "fid_efficientnet_lite0",
        "downstream_accuracy",
        "semantic_distribution_similarity",
        "expect_table_row_count_to_equal",
    } <= names
    assert report.passed, report_text(report)
    assert_bars_complete(
        stages, ["expectations", "memorisation", "attacks", "fidelity", "utility", "sds"]
    )
    utility = next(r for r in report.results if r.name == "downstream_accuracy")
    assert (
        utility.details["release"]["logreg"] > 0.5 and "real" in utility.summary
    )  # digits are learnable
    fid = next(r for r in report.results if r.name == "fid_efficientnet_lite0")
    assert "FID (EfficientNet-Lite0 features)" in fid.summary and fid.details["value"] > 0
    assert fid.details["real_heldout_baseline"] > 0 and "real held-out sample" in fid.summary
    sds = next(r for r in report.results if r.name == "semantic_distribution_similarity")
    assert 0.5 < sds.details["sds"] <= 1.0  # digits vs digits: similar semantics
    arts = {k: v for r in report.results for k, v in r.artifacts.items()}
    assert set(arts) == {"roc_curve", "nearest_neighbour_grid"}
    assert all((tmp_path / "artifacts").joinpath(p.split("/")[-1]).exists() for p in arts.values())
    assert set(report.verdicts().values()) <= {"pass", "info"}
    json.loads(report.to_json())


def test_bad_release_is_blocked_and_stored(parts, tmp_path):
    sens, ho, rel, pub = parts
    images, labels = rel.images.copy(), rel.labels.copy()
    images[4] = sens.images[10]  # copied training image
    labels[6] = 15  # label outside the registered set
    inputs = _inputs(
        parts,
        tmp_path,
        images=images,
        labels=labels,
        expected_count=len(rel) + 5,
        selected_public=None,
        artifacts_dir=None,
    )
    report = run_audit(inputs, FAST)
    failed = {r.name: r for r in report.failures}
    assert {
        "expect_table_row_count_to_equal",
        "expect_column_values_to_not_be_in_set(sha256)",
        "expect_column_values_to_be_in_set(label)",
    } <= set(failed)
    assert failed["expect_column_values_to_not_be_in_set(sha256)"].details["offending_ids"] == [
        "img-4"
    ]
    assert failed["expect_column_values_to_be_in_set(label)"].details["offending_ids"] == ["img-6"]
    from accounting.store import Store, Workspace

    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    save_report(store, report)
    assert load_report(store, "rel-ok").verdicts() == report.verdicts()


def test_unreadable_release_runs_expectations_only(parts, tmp_path):
    sens, ho, rel, pub = parts
    images = rel.images.astype(np.float32)
    images[0, 0, 0] = np.nan
    stages = []
    report = run_audit(
        _inputs(parts, tmp_path, images=images), SMALL, lambda s, d, t: stages.append((s, d, t))
    )
    assert_bars_complete(stages, ["expectations"])
    failed = {r.name for r in report.failures}
    assert {
        "expect_column_values_to_not_be_null(mean_pixel)",
        "expect_column_values_to_be_in_set(dtype)",
        "release_readable",
    } <= failed
    assert "membership_inference" not in {r.name for r in report.results}


def test_missing_attack_inputs_fail_or_inform(parts, tmp_path):
    no_art = dict(selected_public=None, artifacts_dir=None)
    report = run_audit(_inputs(parts, tmp_path, heldout=None, **no_art), FAST)
    mia = next(r for r in report.results if r.name == "membership_inference")
    assert mia.passed is False and "not run" in mia.summary
    lenient = AuditPolicy.from_dict({**FAST.to_dict(), "require_attacks": False})
    report = run_audit(_inputs(parts, tmp_path, loss_fn=None, **no_art), lenient)
    mia = next(r for r in report.results if r.name == "membership_inference")
    assert mia.passed is None and "no loss_fn" in mia.summary


def test_crashing_check_blocks_release(parts, tmp_path):
    def broken(images, labels):
        raise RuntimeError("checkpoint missing")

    report = run_audit(
        _inputs(parts, tmp_path, loss_fn=broken, selected_public=None, artifacts_dir=None), FAST
    )
    mia = next(r for r in report.results if r.name == "membership_inference")
    assert mia.passed is False and "checkpoint missing" in mia.summary and not report.passed


def test_k_anonymous_release(parts, tmp_path):
    sens, ho, _, _ = parts
    k, rng = 3, np.random.default_rng(0)
    clusters = []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(sens.labels == c))
        clusters += [idx[i : i + k] for i in range(0, len(idx) - k + 1, k)]
    reps = (
        np.stack([sens.images[cl].astype(float).mean(0) for cl in clusters])
        .round()
        .astype(np.uint8)
    )
    labels = np.array([np.bincount(sens.labels[cl]).argmax() for cl in clusters])
    inputs = _inputs(
        parts,
        tmp_path,
        images=reps,
        labels=labels,
        ids=[f"rep-{i}" for i in range(len(reps))],
        expected_count=len(reps),
        mechanism="ksalsa",
        guarantee_kind="k-anonymity",
        k=k,
        claimed_epsilon=None,
        delta=None,
        loss_fn=None,
        clusters=clusters,
        selected_public=None,
    )
    stages = []
    report = run_audit(inputs, SMALL, lambda s, d, t: stages.append((s, d, t)))
    assert_bars_complete(stages, ["expectations", "memorisation", "attacks", "fidelity", "utility"])
    res = {r.name: r for r in report.results}
    assert "membership_inference" not in res
    assert (
        res["kanon_cluster_membership"].details["attack_precision"] > 0.7
    )  # plain averages leak membership
    assert res["kanon_reidentification"].details["chance"] == pytest.approx(k / len(sens), rel=0.05)
    # the attack samples feature_samples representatives (kept); FID and utility do not touch it
    strict = AuditPolicy.from_dict(
        {
            **SMALL.to_dict(),
            "kanon_max_attack_precision": 0.55,
            "fid_samples": 8,
            "utility_train_samples": 50,
        }
    )
    again = run_audit(dataclasses.replace(inputs, artifacts_dir=None), strict)
    assert again.verdicts()["kanon_cluster_membership"] == "fail"


def test_invalid_inputs_raise(parts, tmp_path):
    with pytest.raises(DataFormatError):
        run_audit(_inputs(parts, tmp_path, ids=["a", "b"]), SMALL)
    with pytest.raises(InvalidParameterError):
        run_audit(_inputs(parts, tmp_path, guarantee_kind="gan-magic"), SMALL)
    with pytest.raises(InvalidParameterError):
        run_audit(
            _inputs(parts, tmp_path, mechanism="ksalsa", guarantee_kind="k-anonymity", k=None),
            SMALL,
        )
    with pytest.raises(InvalidParameterError):
        run_audit(_inputs(parts, tmp_path, claimed_epsilon=float("nan")), SMALL)
    with pytest.raises(InvalidParameterError):
        run_audit(_inputs(parts, tmp_path, expected_count=-1), SMALL)
    sens, ho, _, _ = parts
    with pytest.raises(DataFormatError):
        run_audit(
            _inputs(
                parts, tmp_path, heldout=ImageDataset(ho.images[:, :20, :20].copy(), ho.labels)
            ),
            SMALL,
        )
    with pytest.raises(DataFormatError):
        run_audit(_inputs(parts, tmp_path, sensitive=sens.images), SMALL)


@pytest.mark.slow
def test_default_policy_on_builtin_mnist(tmp_path):
    """Full-size audit (default policy) of an independent real sample posing as a release."""
    from synth.kinds.datasets import load_source

    sens, ho_all = load_source("builtin:mnist5k"), load_source("builtin:mnist5k-heldout")
    rel, ho = ho_all.subset(np.arange(0, 1000, 2)), ho_all.subset(np.arange(1, 1000, 2))
    inputs = AuditInputs(
        "rel-full",
        rel.images,
        rel.labels,
        [f"i{i}" for i in range(len(rel))],
        len(rel),
        list(range(10)),
        sens,
        ho,
        KEY,
        "privimage",
        2.0,
        1e-5,
        loss_fn=mean_pixel_loss,
        artifacts_dir=tmp_path,
    )
    report = run_audit(inputs, AuditPolicy())
    assert report.passed, report_text(report)
    util = next(r for r in report.results if r.name == "downstream_accuracy")
    assert util.details["release"]["logreg"] > 0.8


# Slow since issue 63 (end to end: a release audited whole; fast:
# test_audit_one_run.py::test_cli_audit_implementation, test_audit_mia_calibrated.py)
@pytest.mark.slow
def test_release_audit_runs_the_one_run_audit_and_the_calibrated_attack(parts, tmp_path):
    from accounting.calibration import calibrate_dpsgd_sigma
    from audit.dpsgd_audit import DpSgdSetting

    setting = DpSgdSetting(0.1, calibrate_dpsgd_sigma(2.0, 1e-5, 0.1, 50), 50, 1.0, 1e-5)
    policy = AuditPolicy.from_dict({**SMALL.to_dict(), "one_run_canaries": 300})
    report = run_audit(
        _inputs(parts, tmp_path, dpsgd=setting, reference_loss_fns=[mean_pixel_loss]), policy
    )
    one_run = next(r for r in report.results if r.name == "dpsgd_one_run_audit")
    assert one_run.details["claimed_epsilon"] == pytest.approx(2.0, abs=0.01)
    assert (
        one_run.details["score"] == "gradients"
    )  # the policy's default: the stronger white-box score
    assert (
        one_run.details["eps_lower"] < 2.0 and "vs claimed eps 2.0" in one_run.summary
    )  # no proven violation
    # The Gaussian estimate (not a proof) can flag a correct run by chance at 300 canaries: CI once saw
    # "suspect" here with the proven bound at 1.05 (what it flags: test_audit_one_run*.py, BENCHMARKS.md).
    assert one_run.details["status"] in ("consistent", "suspect")
    assert one_run.passed == (one_run.details["status"] == "consistent")
    assert (tmp_path / "artifacts" / "canary_scores.png").exists()
    mia = next(r for r in report.results if r.name == "membership_inference")
    assert set(mia.details["attacks"]) == {"loss", "calibrated"}
    assert "tpr_01pct" in mia.details["attacks"]["calibrated"]
    off = run_audit(
        _inputs(parts, tmp_path, dpsgd=setting),
        AuditPolicy.from_dict({**SMALL.to_dict(), "one_run_canaries": None}),
    )
    assert "dpsgd_one_run_audit" not in off.verdicts()
