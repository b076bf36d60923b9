"""run_audit: every check of a release, in order, into one AuditReport.

A check that cannot run for lack of inputs (no held-out data, no loss function) fails when the
policy requires attacks, else it is reported as informational; a check that crashes is reported as
failed with its error, so that no release is published unchecked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from accounting.errors import InvalidParameterError
from accounting.fingerprint import record_fingerprints
from audit.baseline import compare as compare_with_baselines
from audit.checks import _cannot_run, _guard
from audit.inputs import AuditInputs
from audit.kinds import KindAudit, kind_audit
from audit.policy import AuditPolicy
from audit.report import AuditReport, CheckResult
from synth.kinds.datasets import ImageDataset
from synth.progress import ProgressFn, no_progress
from synth.registry import DP

if TYPE_CHECKING:  # torch-heavy: imported only where the one-run audit runs
    pass


def _implementation_audit(inputs: AuditInputs, policy: AuditPolicy) -> CheckResult:
    """One-run audit of the executed DP-SGD settings on public data (the public images a DP query
    selected, else UCI digits): reads no sensitive data."""
    from audit.dpsgd_audit import check_implementation_audit, compute_implementation_audit
    from synth.kinds.datasets import uci_digits

    if inputs.dpsgd is None or policy.one_run_canaries is None:  # _attacks runs it only with both
        raise InvalidParameterError(
            "The implementation audit needs the executed DP-SGD settings and a canary count."
        )
    public = inputs.selected_public if inputs.selected_public is not None else uci_digits()
    audit = compute_implementation_audit(
        inputs.dpsgd,
        public,
        m=int(policy.one_run_canaries),
        seed=policy.seed,
        score=policy.one_run_score,
    )
    return check_implementation_audit(audit, inputs.artifacts_dir)


def run_audit(
    inputs: AuditInputs, policy: AuditPolicy | None = None, progress: ProgressFn = no_progress
) -> AuditReport:
    """Every check in order; embeddings and FID statistics are cached for this audit only. An
    output kind with an audit of its own (audit.kinds.KindAudit.run) gets that one instead."""
    kind = kind_audit(inputs.output_kind or "images")
    if kind.run is not None:
        return kind.run(inputs, policy or AuditPolicy(), progress)
    from audit.images import audit_cache

    with audit_cache():
        return _run_audit(inputs, policy, progress)


def _training_distances(
    images: np.ndarray, sens: ImageDataset
) -> tuple[bool, np.ndarray, np.ndarray]:
    """(usable, d_tr, idx_tr): pixel distances to the nearest training image, for the release table
    and the memorisation check; `usable` = non-empty uint8 images of the sensitive set's shape."""
    from audit.images import rms_nearest

    usable = (
        images.dtype == np.uint8 and images.shape[1:] == sens.images.shape[1:] and len(images) > 0
    )
    if usable:
        return True, *rms_nearest(images, sens.images)
    if (
        images.shape[1:] == sens.images.shape[1:] and len(images) > 0
    ):  # e.g. float pixels: table stays informative
        with np.errstate(invalid="ignore"):
            clean = np.clip(np.nan_to_num(images.astype(np.float64)), 0, 255).astype(np.uint8)
        return False, *rms_nearest(clean, sens.images)
    return False, np.full(len(images), np.nan), np.zeros(len(images), np.int64)


def _expectations(
    inputs: AuditInputs, images: np.ndarray, labels: np.ndarray, d_tr: np.ndarray
) -> list[CheckResult]:
    from audit.expectations import build_suite, release_table, validate_table

    sens = inputs.sensitive_images
    table = release_table(images, labels, inputs.ids, inputs.record_fingerprint_key, d_tr)
    suite = build_suite(
        inputs.expected_count,
        inputs.label_set,
        sens.image_shape,
        record_fingerprints(inputs.record_fingerprint_key, sens.images),
    )
    return validate_table(table, suite)


def _attacks(
    inputs: AuditInputs, images: np.ndarray, policy: AuditPolicy, art: Path | None
) -> list[CheckResult]:
    kind = kind_audit(inputs.output_kind or "images")
    if inputs.guarantee_kind == "k-anonymity":
        return _kanon_attacks(inputs, images, policy, kind)
    if inputs.guarantee_kind != DP:  # empirical: judged by the attacks of its output kind
        return kind.attacks(inputs, images, policy) or [
            CheckResult(
                "kind_attacks",
                "attack",
                False,
                f"no attack tests an {inputs.guarantee_kind} release of output kind "
                f"{inputs.output_kind!r}: its kind registers none (audit.kinds)",
                {},
            )
        ]
    out: list[CheckResult] = []
    out += _membership_inference(inputs, policy, art)
    if inputs.dpsgd is not None and policy.one_run_canaries is not None:
        out += _guard(
            "dpsgd_one_run_audit", "attack", lambda: _implementation_audit(inputs, policy)
        )
    return out + kind.attacks(inputs, images, policy)


def _kanon_attacks(
    inputs: AuditInputs, images: np.ndarray, policy: AuditPolicy, kind: KindAudit
) -> list[CheckResult]:
    """The k-anonymity attacks on the clusters, then the output kind's (or why none can run)."""
    sens, ho = inputs.sensitive_images, inputs.heldout
    clusters = inputs.clusters
    if clusters is None:
        return [_cannot_run("kanon_cluster_membership", "attack", "no cluster memberships", policy)]
    from audit.kanon_attacks import check_kanon_attacks, compute_kanon_attacks

    return _guard(
        "kanon_attacks",
        "attack",
        lambda: check_kanon_attacks(
            compute_kanon_attacks(images, clusters, sens, ho, inputs.k, policy), policy
        ),
    ) + kind.attacks(inputs, images, policy)


def _membership_inference(
    inputs: AuditInputs, policy: AuditPolicy, art: Path | None
) -> list[CheckResult]:
    """The membership-inference attack on a DP release (or why it cannot run)."""
    sens, ho = inputs.sensitive_images, inputs.heldout
    loss_fn = inputs.loss_fn
    if loss_fn is None:
        return [
            _cannot_run("membership_inference", "attack", "no loss_fn for the generator", policy)
        ]
    if ho is None:
        return [
            _cannot_run("membership_inference", "attack", "no held-out (non-member) data", policy)
        ]
    from audit.mia import run_mia

    return _guard(
        "membership_inference",
        "attack",
        lambda: run_mia(
            loss_fn,
            sens,
            ho,
            inputs.claimed_epsilon,
            inputs.delta,
            policy,
            art,
            inputs.reference_loss_fns,
        ),
    )


def _utility(
    inputs: AuditInputs, images: np.ndarray, labels: np.ndarray, policy: AuditPolicy
) -> list[CheckResult]:
    heldout = inputs.heldout
    if heldout is None:
        gate = (
            (
                '; the utility gate needs real held-out images: give `heldout = "PATH"` in the '
                "spec's [release] table (real images not in the registered data), or set "
                "min_utility_gain = 0.0 in [policy] to turn the gate off"
            )
            if policy.utility_gated
            else ""
        )
        return [
            CheckResult(
                "downstream_accuracy",
                "utility",
                False if policy.utility_gated else None,
                "not run: no held-out test data" + gate,
                {"reason": "no held-out data"},
            )
        ]
    from audit.utility import run_utility

    return _guard(
        "downstream_accuracy",
        "utility",
        lambda: run_utility(images, labels, inputs.sensitive_images, heldout, policy),
    )


class _Stages:
    """Each audit stage is one bar, "audit: NAME" 0/1 while it runs and 1/1 (clock stopped) when it
    ends."""

    def __init__(self, progress: ProgressFn) -> None:
        self.progress: ProgressFn = progress
        self.current: str | None = None

    def begin(self, name: str) -> None:
        self.end()
        self.current = f"audit: {name}"
        self.progress(self.current, 0, 1)

    def end(self) -> None:
        if self.current is not None:
            self.progress(self.current, 1, 1)
            self.current = None


def _run_audit(
    inputs: AuditInputs, policy: AuditPolicy | None, progress: ProgressFn
) -> AuditReport:
    policy = policy or AuditPolicy()
    inputs.validate()
    images, labels = np.asarray(inputs.images), np.asarray(inputs.labels).astype(np.int64)
    sens, ho = inputs.sensitive_images, inputs.heldout
    art = Path(inputs.artifacts_dir) if inputs.artifacts_dir is not None else None
    report = AuditReport(inputs.release_id)
    stage = _Stages(progress)

    stage.begin("expectations")
    usable, d_tr, idx_tr = _training_distances(images, sens)
    report.results += _expectations(inputs, images, labels, d_tr)
    if (
        not usable
    ):  # wrong dtype/shape or empty: the expectations say why; nothing else is meaningful
        report.results.append(_unreadable(sens.image_shape, images))
        stage.end()
        return report
    stage.begin("memorisation")
    report.results += _memorisation(inputs, images, d_tr, idx_tr, policy, art)
    stage.begin("attacks")
    report.results += _attacks(inputs, images, policy, art)
    stage.begin("fidelity")
    from audit.fidelity import CHECK_FID, run_fidelity

    report.results += _guard(CHECK_FID, "fidelity", lambda: run_fidelity(images, sens, policy, ho))
    stage.begin("utility")
    report.results += _utility_and_baselines(inputs, images, labels, policy)
    selected = inputs.selected_public
    if selected is not None:
        stage.begin("sds")
        from audit.sds import run_sds

        report.results += _guard(
            "semantic_distribution_similarity", "fidelity", lambda: run_sds(selected, sens, policy)
        )
    stage.end()
    return report


def _unreadable(shape: tuple[int, ...], images: np.ndarray) -> CheckResult:
    """The failed readability check of release images that are not the sensitive set's kind."""
    return CheckResult(
        "release_readable",
        "expectations",
        False,
        "attacks and metrics not run: release images are not "
        "non-empty uint8 images of the sensitive set's shape "
        f"{shape} (got {images.dtype}, {images.shape})",
        {},
    )


def _memorisation(
    inputs: AuditInputs,
    images: np.ndarray,
    d_tr: np.ndarray,
    idx_tr: np.ndarray,
    policy: AuditPolicy,
    art: Path | None,
) -> list[CheckResult]:
    """The memorisation (DCR) check; not applicable to an empirical de-identification release."""
    if inputs.guarantee_kind == "empirical":
        return [
            CheckResult(
                "memorisation_dcr",
                "attack",
                None,
                "not applicable: an empirical de-identification release keeps each record outside "
                "what it replaces (an image's background), so every row is a pixel near-copy by "
                "design; the re-identification attack judges it",
                {"reason": "near-copies by design"},
            )
        ]
    from audit.memorisation import run_memorisation

    sens, ho = inputs.sensitive_images, inputs.heldout
    return _guard(
        "memorisation_dcr",
        "attack",
        lambda: run_memorisation(images, sens, ho, d_tr, idx_tr, policy, art),
    )


def _utility_and_baselines(
    inputs: AuditInputs, images: np.ndarray, labels: np.ndarray, policy: AuditPolicy
) -> list[CheckResult]:
    """The utility checks, and the downstream accuracy against the baselines where there are
    some."""
    utility = _utility(inputs, images, labels, policy)
    results = list(utility)
    best = next((r.details.get("best") for r in utility if r.name == "downstream_accuracy"), None)
    if inputs.baselines and isinstance(best, float):
        results.append(compare_with_baselines(best, list(inputs.baselines)))
    return results
