"""Audit thresholds: the release spec's [policy] table. Each attack/metric with a threshold here
gets a pass/fail verdict; a threshold of None makes that check informational."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from accounting.errors import InvalidParameterError

# fields that are fractions / probabilities, checked to lie in [0, 1]
_UNIT = {
    "mia_max_auc",
    "mia_max_tpr_at_1pct_fpr",
    "mia_max_tpr_at_01pct_fpr",
    "max_near_copy_fraction",
    "max_closer_to_train_fraction",
    "kanon_max_attack_precision",
    "kanon_max_reid_rate",
    "min_downstream_accuracy",
    "min_utility_gain",
    "min_sds",
    "mia_confidence",
    "face_max_verification_rate",
    "face_max_rank1_rate",
    "face_min_detection_retention",
    "near_copy_max_distance",
    "volume_max_face_correlation",
    "volume_reid_alpha",
}
_POSITIVE_INT = {
    "one_run_canaries",
    "dcr_repeats",
    "mia_samples",
    "feature_samples",
    "fid_samples",
    "utility_train_samples",
    "cnn_epochs",
    "sds_clusters",
    "grid_pairs",
    "volume_min_subjects",
    "face_samples",
    "face_probe",
}
FACE_MODES = ("auto", "on", "off")


@dataclass
class AuditPolicy:
    # membership inference on the released generator (loss-threshold attack)
    mia_max_auc: float = 0.6
    mia_max_tpr_at_1pct_fpr: float = 0.05  # chance level is 0.01
    mia_max_tpr_at_01pct_fpr: float | None = None  # chance level is 0.001; informational by default
    mia_samples: int = 500  # members and non-members each
    mia_confidence: float = 0.95  # Clopper-Pearson level of the epsilon lower bound
    # one-run audit of the DP-SGD implementation at the release's settings (public data + canaries)
    one_run_canaries: int | None = 1000
    # canary score: "gradients" (every step's privatised gradient; certifies more at small noise,
    # and stayed below the charge in 20/20 honest runs, BENCHMARKS.md "One-run audit") or "model"
    # (final weights only)
    one_run_score: str = "gradients"
    # memorisation / distance to closest record
    near_copy_ratio: float = 0.5  # d_train / d_heldout below this ...
    # ... and RMS pixel distance (pixels in [0, 1]) below this = near-copy
    near_copy_max_distance: float = 0.08
    max_near_copy_fraction: float = 0.01
    max_closer_to_train_fraction: float | None = None  # ~0.5 is healthy; informational by default
    dcr_repeats: int = 5  # training subsampled to the held-out size this many times
    # k-anonymous releases
    # cluster-membership attack top-k precision (chance 0.5)
    kanon_max_attack_precision: float = 0.9
    kanon_max_reid_rate: float = 0.9  # representative -> top-1 nearest record is one of its sources
    # head volume releases (deface, reface; audit/volumes.py). Every brain voxel must be unchanged
    # (no threshold: exactly 0). The face region's *detail* (intensity minus its 2 mm Gaussian
    # blur) must not correlate with the original's above this; the plain correlation of any two
    # aligned faces is ~0.8 (air in front, skin, tissue behind), so it is reported, not gated.
    volume_max_face_correlation: float | None = 0.3
    # re-identification of face renders among the originals: fails when rank-1 matches are
    # significantly above chance (one-sided binomial test at this level)
    volume_reid_alpha: float = 0.05
    volume_min_subjects: int = 5  # fewer: the test cannot tell a match from chance (not run)
    # face re-identification (audit/face_reid.py): "auto" runs it on every empirical
    # de-identification release and on any other release whose sensitive set holds faces (images
    # of at least 32 px, the detector finding one in at least half of `face_probe` of them); "on"
    # always, "off" never
    face_reidentification: str = "auto"
    # the recognisers that attack every face release, each with its own detection and alignment
    # (synth.tools.face_recognisers.RECOGNISERS); a mechanism that searched against some of them is
    # judged by the others too
    face_recognisers: tuple[str, ...] = ("dlib", "sface", "facenet")
    # share of released faces a recogniser still verifies as their original (TAR at its own
    # threshold; for synthetic releases: matches with training faces above the held-out rate)
    face_max_verification_rate: float | None = 0.05
    # rank-1 identification above chance (one-sided binomial test) at this level fails; 0: never
    face_rank1_alpha: float | None = 0.05
    face_max_rank1_rate: float | None = None  # rank-1 ceiling; informational by default
    # realism of replaced faces (paired releases whose faces stay in place: face-deid): the share
    # YuNet still finds (confidence >= 0.8, IoU >= 0.5), the mean displacement of YuNet's 5
    # landmarks (inter-ocular distances), and whether their KID is below blurred faces'
    face_min_detection_retention: float | None = 0.99
    face_max_landmark_shift: float | None = 0.05
    face_max_kid_vs_blur: bool = True
    face_samples: int = 200  # released images attacked, and original photos in the gallery
    face_probe: int = 16  # sensitive images the "auto" rule looks at
    # an embedder of synth.tools.face_models.EMBEDDERS other than dlib (older specs) attacks as well
    face_embedder: str = "dlib"
    # fidelity and utility Utility gate: the best of LR / MLP / CNN trained on the release and
    # tested on the real held-out set must reach chance + min_utility_gain * (1 - chance), chance =
    # the held-out majority-class rate. Default 1/3 of the way from guessing to perfect (0.40 for 10
    # balanced classes): noise and mode-collapsed releases score near chance, real MNIST-5k data
    # about 0.9, so the gate refuses noise while leaving DP noise a wide margin.
    # min_downstream_accuracy adds an absolute floor; 0 or None turns the relative gate off (TOML
    # has no null).
    min_utility_gain: float | None = 1 / 3
    min_downstream_accuracy: float | None = None
    max_fid: float | None = None  # FID (EfficientNet-Lite0 features)
    min_sds: float | None = None
    # an attack that cannot run (no held-out data, no loss function) fails instead of being skipped
    require_attacks: bool = True
    # cost controls
    feature_samples: int = 1000  # images embedded per set for feature-space checks
    fid_samples: int = 1000
    utility_train_samples: int = 2000
    cnn_epochs: int = 3
    sds_clusters: int = 10
    grid_pairs: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if self._checked_non_numeric(f.name, value, f.type):
                continue
            _check_number(f.name, value)
            _check_bounds(f.name, value)

    def _checked_non_numeric(self, name: str, value: Any, type_: Any) -> bool:
        """Check a field that is not a plain number (flags, an unset optional, the face mode,
        recogniser and embedder names, the one-run score); True if it was one."""
        if name in ("require_attacks", "face_max_kid_vs_blur"):
            if not isinstance(value, bool):
                raise InvalidParameterError(
                    f"audit policy {name} must be true or false, got {value!r}."
                )
            return True
        if value is None and "None" in str(type_):
            return True
        if name == "face_reidentification":
            if value not in FACE_MODES:
                raise InvalidParameterError(
                    f"audit policy face_reidentification must be one of {', '.join(FACE_MODES)}"
                    f", got {value!r}."
                )
            return True
        if name == "face_recognisers":
            self.face_recognisers = _recogniser_keys(value)
            return True
        if name == "face_embedder":
            if not isinstance(value, str) or not value:
                raise InvalidParameterError(
                    f"audit policy face_embedder must name an embedder, got {value!r}."
                )
            return True
        if name == "one_run_score":
            if value not in ("gradients", "model"):
                raise InvalidParameterError(
                    f'audit policy one_run_score must be "gradients" or "model", got {value!r}.'
                )
            return True
        return False

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AuditPolicy:
        """Build from the spec's [policy] table; unknown keys are refused (typos must not silently
        fall back to a default threshold)."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidParameterError(
                f"Unknown audit policy key(s) {unknown}; valid keys are {sorted(known)}."
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def utility_threshold(self, chance: float) -> float | None:
        """Accuracy the release must reach, given the held-out majority-class rate; None = no
        gate."""
        # 0 = off
        limits = [chance + self.min_utility_gain * (1 - chance)] if self.min_utility_gain else []
        limits += [self.min_downstream_accuracy] if self.min_downstream_accuracy is not None else []
        return max(limits) if limits else None

    @property
    def utility_gated(self) -> bool:
        return bool(self.min_utility_gain) or self.min_downstream_accuracy is not None


def _check_number(name: str, value: Any) -> None:
    """A numeric policy field is a finite number; a share lies in [0, 1], a count is a whole
    number >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameterError(f"audit policy {name} must be a finite number, got {value!r}.")
    if name in _UNIT and not 0 <= value <= 1:
        raise InvalidParameterError(f"audit policy {name} must be between 0 and 1, got {value}.")
    if name in _POSITIVE_INT and (int(value) != value or value < 1):
        raise InvalidParameterError(f"audit policy {name} must be a positive integer, got {value}.")


def _check_bounds(name: str, value: float) -> None:
    """The bounds particular to one numeric policy field."""
    if name == "near_copy_ratio" and value <= 0:
        raise InvalidParameterError(f"audit policy near_copy_ratio must be > 0, got {value}.")
    if name == "face_max_landmark_shift" and value < 0:
        raise InvalidParameterError(
            f"audit policy face_max_landmark_shift must be >= 0, got {value}."
        )
    if name == "max_fid" and value < 0:
        raise InvalidParameterError(f"audit policy max_fid must be >= 0, got {value}.")
    if name == "one_run_canaries" and value < 10:
        raise InvalidParameterError(
            f"audit policy one_run_canaries must be >= 10 (or omitted), got {value}."
        )
    if name == "volume_min_subjects" and value < 2:
        raise InvalidParameterError(
            f"audit policy volume_min_subjects must be >= 2 (rank-1 needs a choice), got {value}."
        )
    if name == "volume_reid_alpha" and not 0 < value < 1:
        raise InvalidParameterError(
            f"audit policy volume_reid_alpha must be strictly between 0 and 1, got {value}."
        )
    if name == "face_rank1_alpha" and not 0 <= value < 1:
        raise InvalidParameterError(
            f"audit policy face_rank1_alpha must be at least 0 and below 1 (0 makes rank-1 "
            f"informational: no p-value is below 0), got {value}."
        )
    if name == "sds_clusters" and value < 2:
        raise InvalidParameterError(f"audit policy sds_clusters must be >= 2, got {value}.")


def _recogniser_keys(value: Any) -> tuple[str, ...]:
    """The policy's face_recognisers as a tuple of known keys (TOML gives a list)."""
    from synth.tools.face_recognisers import RECOGNISERS

    known = ", ".join(sorted(RECOGNISERS))
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise InvalidParameterError(
            f"audit policy face_recognisers must be a non-empty list of recognisers ({known}), "
            f"got {value!r}."
        )
    unknown = [k for k in value if k not in RECOGNISERS]
    if unknown:
        raise InvalidParameterError(
            f"audit policy face_recognisers names unknown recogniser(s) {unknown}; known: {known}."
        )
    return tuple(dict.fromkeys(value))


# What the utility gate reveals, for the dataset card (the publication decision depends on it).
UTILITY_GATE_CHANNEL = (
    "Utility gate (uncharged channel): the release was published only because "
    "classifiers trained on it reached the required accuracy on a real held-out set "
    "that is not part of the registered dataset. The decision is a function of this DP "
    "release and of that held-out set only, so it is post-processing with respect to "
    "the registered records and spends no budget; it reveals about one bit about the "
    "held-out set (whether the release is useful on it), which carries no DP guarantee."
)
