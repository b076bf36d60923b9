"""run_audit: every check of a release, in order, into one AuditReport.

A check that cannot run for lack of inputs (no held-out data, no loss function) fails when the
policy requires attacks, else it is reported as informational; a check that crashes is reported as
failed with its error, so that no release is published unchecked."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from accounting.errors import DataFormatError, InvalidParameterError
from accounting.fingerprint import record_fingerprints
from audit.baseline import Baseline
from audit.baseline import compare as compare_with_baselines
from audit.checks import _cannot_run, _guard
from audit.policy import AuditPolicy
from audit.report import AuditReport, CheckResult
from synth.kinds.datasets import ImageDataset
from synth.kinds.volume import VolumeDataset
from synth.progress import ProgressFn, no_progress
from synth.registry import DP, GUARANTEE_KINDS

if TYPE_CHECKING:  # torch-heavy: imported only where the one-run audit runs
    from audit.dpsgd_audit import DpSgdSetting


@dataclass
class AuditInputs:
    release_id: str
    images: np.ndarray  # the release: uint8 (N, H, W[, C])
    labels: np.ndarray
    ids: list[str]
    expected_count: int  # n requested, or floor(n / k) for k-anonymous releases
    label_set: list[int]  # the registered label set
    # training (member) data; the original head volumes of a volume release
    sensitive: ImageDataset | VolumeDataset
    heldout: ImageDataset | None  # real held-out data (non-members, utility test set)
    record_fingerprint_key: bytes  # HMAC key for the exact-copy check
    mechanism: str  # the registry name of the mechanism that made the release
    claimed_epsilon: float | None = None
    delta: float | None = None
    k: int | None = None
    # per-sample diffusion loss
    loss_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    clusters: list[np.ndarray] | None = None  # sensitive indices per representative (k-anonymous)
    selected_public: ImageDataset | None = None  # PrivImage's selected public images (SDS)
    artifacts_dir: Path | None = None  # PNGs go here
    # models that never saw the sensitive set (e.g. the public pre-trained generator): calibrate the
    # MIA
    reference_loss_fns: list[Callable[[np.ndarray, np.ndarray], np.ndarray]] | None = None
    # the executed DP-SGD run: one-run audit of its implementation
    dpsgd: DpSgdSetting | None = None
    # what the release claims (synth.registry.GUARANTEE_KINDS): picks the attacks that test it
    guarantee_kind: str = DP
    # a volume release (audit/volumes.py): the released volumes, in the order of `sensitive`, and
    # the NIfTI files as written (their headers are checked)
    volumes: VolumeDataset | None = None
    volume_files: list[Path] | None = None
    cache_dir: Path | None = None  # public template atlases (synth.tools.mri.atlas), shared
    # earlier DP releases of the same dataset by other mechanisms, measured on the same held-out
    # source (audit.baseline): compared with this release's downstream accuracy
    baselines: list[Baseline] = field(default_factory=list)
    # the face recognisers a de-identification mechanism searched against (its parameters'
    # `searched_recognisers`): the face checks say which recognisers were held out
    searched_recognisers: list[str] | None = None

    @property
    def sensitive_images(self) -> ImageDataset:
        if not isinstance(self.sensitive, ImageDataset):
            raise DataFormatError(
                "sensitive must be an ImageDataset for an image release, got "
                f"{type(self.sensitive).__name__}."
            )
        return self.sensitive

    def validate(self) -> None:
        if not isinstance(self.sensitive, ImageDataset):
            raise DataFormatError(
                f"sensitive must be an ImageDataset, got {type(self.sensitive).__name__}."
            )
        if self.guarantee_kind not in GUARANTEE_KINDS:
            raise InvalidParameterError(
                f"guarantee_kind must be one of {sorted(GUARANTEE_KINDS)}, got "
                f"{self.guarantee_kind!r}."
            )
        images = np.asarray(self.images)
        if images.ndim not in (3, 4):
            raise DataFormatError(
                f"release images must be (N, H, W) or (N, H, W, C), got shape {images.shape}."
            )
        if np.asarray(self.labels).shape != (len(images),) or len(self.ids) != len(images):
            raise DataFormatError(
                f"release has {len(images)} images, {np.asarray(self.labels).shape} labels and "
                f"{len(self.ids)} ids; give one label and one id per image."
            )
        if not np.issubdtype(images.dtype, np.number):
            raise DataFormatError(f"release images have non-numeric dtype {images.dtype}.")
        if (
            not isinstance(self.expected_count, (int, np.integer))
            or isinstance(self.expected_count, bool)
            or self.expected_count < 0
        ):
            raise InvalidParameterError(
                f"expected_count must be a non-negative integer, got {self.expected_count!r}."
            )
        for name, other in (("heldout", self.heldout), ("selected_public", self.selected_public)):
            if other is not None and not isinstance(other, ImageDataset):
                raise DataFormatError(
                    f"{name} must be an ImageDataset or None, got {type(other).__name__}."
                )
        if self.heldout is not None and self.heldout.image_shape != self.sensitive.image_shape:
            raise DataFormatError(
                f"held-out images have shape {self.heldout.image_shape} but the sensitive set "
                f"{self.sensitive.image_shape}; give held-out data of the same format."
            )
        if (
            self.guarantee_kind == "k-anonymity"
            and self.clusters is not None
            and len(self.clusters) != len(images)
        ):
            raise DataFormatError(
                f"{len(self.clusters)} clusters for {len(images)} released representatives; give "
                "one array of sensitive indices per representative, in release order."
            )
        if not self.label_set:
            raise InvalidParameterError("label_set is empty; give the registered dataset's labels.")
        if self.claimed_epsilon is not None and (
            not math.isfinite(self.claimed_epsilon) or self.claimed_epsilon <= 0
        ):
            raise InvalidParameterError(
                "claimed_epsilon must be a finite positive number or None, got "
                f"{self.claimed_epsilon!r}."
            )
        if self.delta is not None and not (0 <= self.delta < 1):
            raise InvalidParameterError(f"delta must be in [0, 1) or None, got {self.delta!r}.")
        if self.guarantee_kind == "k-anonymity" and (
            self.k is None or int(self.k) != self.k or self.k < 1
        ):
            raise InvalidParameterError(
                f"a k-anonymous release needs an integer k >= 1, got {self.k!r}."
            )
        if (
            not isinstance(self.record_fingerprint_key, (bytes, bytearray))
            or not self.record_fingerprint_key
        ):
            raise InvalidParameterError(
                "record_fingerprint_key must be the workspace's HMAC key (non-empty bytes)."
            )


def _implementation_audit(inputs: AuditInputs, policy: AuditPolicy) -> CheckResult:
    """One-run audit of the executed DP-SGD settings on public data (PrivImage's selected public
    set, else UCI digits): reads no sensitive data."""
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
    """Every check in order; embeddings and FID statistics are cached for this audit only. A
    volume release gets the volume checks (audit/volumes.py)."""
    if inputs.volumes is not None:
        from audit.volumes import run_volume_audit

        return run_volume_audit(inputs, policy or AuditPolicy(), progress)
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
    sens, ho = inputs.sensitive_images, inputs.heldout
    if inputs.guarantee_kind == "k-anonymity":
        clusters = inputs.clusters
        if clusters is None:
            return [
                _cannot_run("kanon_cluster_membership", "attack", "no cluster memberships", policy)
            ]
        from audit.kanon_attacks import run_kanon_attacks

        return _guard(
            "kanon_attacks",
            "attack",
            lambda: run_kanon_attacks(images, clusters, sens, ho, inputs.k, policy),
        ) + _face_attack(inputs, images, policy, required=False)
    if inputs.guarantee_kind != DP:  # empirical de-identification: judged by the face attack
        return _face_attack(inputs, images, policy, required=True)
    out: list[CheckResult] = []
    loss_fn = inputs.loss_fn
    if loss_fn is None:
        out.append(
            _cannot_run("membership_inference", "attack", "no loss_fn for the generator", policy)
        )
    elif ho is None:
        out.append(
            _cannot_run("membership_inference", "attack", "no held-out (non-member) data", policy)
        )
    else:
        from audit.mia import run_mia

        out += _guard(
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
    if inputs.dpsgd is not None and policy.one_run_canaries is not None:
        out += _guard(
            "dpsgd_one_run_audit", "attack", lambda: _implementation_audit(inputs, policy)
        )
    return out + _face_attack(inputs, images, policy, required=False)


def _face_attack(
    inputs: AuditInputs, images: np.ndarray, policy: AuditPolicy, *, required: bool
) -> list[CheckResult]:
    """The face re-identification attack where the data are faces (policy
    `face_reidentification`: "auto" asks the detector about the sensitive set). `required`: the
    release's guarantee rests on it (empirical de-identification), so "not run" is a failure."""
    from audit.face_reid import CHECK, faces_present, run_face_reid

    sensitive = inputs.sensitive
    if not isinstance(sensitive, ImageDataset):  # volumes: run_audit sends them to their own checks
        return []
    mode = policy.face_reidentification
    if mode == "off":
        if not required:
            return []
        return [_cannot_run(CHECK, "attack", 'face_reidentification = "off" in [policy]', policy)]
    if mode == "auto":
        present, found = faces_present(sensitive, policy)
        if not present and not required:
            return []
        if not present:
            return [
                CheckResult(
                    CHECK,
                    "attack",
                    False,
                    "not run: the detector found a face in only "
                    f"{found['with_a_face']} of {found['probed']} sensitive images, and face "
                    f"re-identification is the only attack on a {inputs.guarantee_kind} release",
                    found,
                )
            ]
    sources = None if inputs.clusters is None else list(inputs.clusters)
    return _guard(
        CHECK,
        "attack",
        lambda: run_face_reid(
            images, sources, sensitive, inputs.heldout, policy, inputs.searched_recognisers
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
        report.results.append(
            CheckResult(
                "release_readable",
                "expectations",
                False,
                "attacks and metrics not run: release images are not "
                "non-empty uint8 images of the sensitive set's shape "
                f"{sens.image_shape} (got {images.dtype}, {images.shape})",
                {},
            )
        )
        stage.end()
        return report
    stage.begin("memorisation")
    if inputs.guarantee_kind == "empirical":
        report.results.append(
            CheckResult(
                "memorisation_dcr",
                "attack",
                None,
                "not applicable: an empirical de-identification release keeps each record outside "
                "what it replaces (a photo's background), so every row is a pixel near-copy by "
                "design; the re-identification attack judges it",
                {"reason": "near-copies by design"},
            )
        )
    else:
        from audit.memorisation import run_memorisation

        report.results += _guard(
            "memorisation_dcr",
            "attack",
            lambda: run_memorisation(images, sens, ho, d_tr, idx_tr, policy, art),
        )
    stage.begin("attacks")
    report.results += _attacks(inputs, images, policy, art)
    stage.begin("fidelity")
    from audit.fidelity import CHECK_FID, run_fidelity

    report.results += _guard(CHECK_FID, "fidelity", lambda: run_fidelity(images, sens, policy, ho))
    stage.begin("utility")
    utility = _utility(inputs, images, labels, policy)
    report.results += utility
    best = next((r.details.get("best") for r in utility if r.name == "downstream_accuracy"), None)
    if inputs.baselines and isinstance(best, float):
        report.results.append(compare_with_baselines(best, list(inputs.baselines)))
    selected = inputs.selected_public
    if selected is not None:
        stage.begin("sds")
        from audit.sds import run_sds

        report.results += _guard(
            "semantic_distribution_similarity", "fidelity", lambda: run_sds(selected, sens, policy)
        )
    stage.end()
    return report
