"""Audit thresholds: the release spec's [policy] table. Each attack/metric with a threshold here
gets a pass/fail verdict; a threshold of None makes that check informational.

The table is flat, as users write it: the core keys below (AuditPolicy's fields) plus the keys each
output kind's checks declare in a section of their own (a frozen dataclass whose fields are its
keys, validated by its __post_init__; audit.kinds.KindAudit.policy, registered with the kind).
`AuditPolicy.from_dict` checks a table against the core keys and every registered section's; the
kind's checks read their keys with `policy.section(TYPE)`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from accounting.errors import InvalidParameterError

S = TypeVar("S")

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
    "near_copy_max_distance",
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
}

# output kind -> the section type of its keys (kinds may share one); see register_section
_SECTIONS: dict[str, type] = {}


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

    # the registered output kinds' keys, one section per section type: the table's values where it
    # gave them, else the section's defaults
    sections: dict[type, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for f in _core_fields():
            value = getattr(self, f.name)
            if self._checked_non_numeric(f.name, value, f.type):
                continue
            check_number(f.name, value, share=f.name in _UNIT, count=f.name in _POSITIVE_INT)
            _check_bounds(f.name, value)
        for section in registered_sections():
            self.sections.setdefault(section, section())

    def _checked_non_numeric(self, name: str, value: Any, type_: Any) -> bool:
        """Check a field that is not a plain number (the flag, an unset optional, the one-run
        score); True if it was one."""
        if name == "require_attacks":
            check_flag(name, value)
            return True
        if value is None and "None" in str(type_):
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
        """Build from the spec's [policy] table: the core keys, then each registered section's;
        unknown keys are refused (typos must not silently fall back to a default threshold)."""
        d = dict(d or {})
        core = {f.name for f in _core_fields()}
        owner = {key: section for section in registered_sections() for key in _keys(section)}
        unknown = sorted(set(d) - core - set(owner))
        if unknown:
            raise InvalidParameterError(
                f"Unknown audit policy key(s) {unknown}; valid keys are "
                f"{sorted(core | set(owner))}."
            )
        policy = cls(**{k: v for k, v in d.items() if k in core})
        for section in registered_sections():
            given = {k: v for k, v in d.items() if owner.get(k) is section}
            if given:
                policy.sections[section] = section(**given)
        return policy

    def to_dict(self) -> dict[str, Any]:
        """The flat table: the core keys and every section's."""
        out = {f.name: getattr(self, f.name) for f in _core_fields()}
        for values in self.sections.values():
            out.update(asdict(values))
        return out

    def section(self, section: type[S]) -> S:
        """An output kind's keys (the section's defaults where the table gave none)."""
        found = self.sections.get(section)
        return found if found is not None else section()

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


def _core_fields() -> list[Any]:
    return [f for f in fields(AuditPolicy) if f.name != "sections"]


def _keys(section: type) -> list[str]:
    return [f.name for f in fields(section)]


def register_section(kind: str, section: type) -> None:
    """Make the keys of output kind `kind` valid in [policy]: `section` is a frozen dataclass, one
    field per key (its default the key's default), that validates its values. Refuses a key the
    core or another section declares."""
    if not (isinstance(section, type) and is_dataclass(section)):
        raise TypeError(f"{section!r} is not a dataclass type of policy keys")
    taken = {f.name for f in _core_fields()} | {
        key for other in registered_sections() if other is not section for key in _keys(other)
    }
    clash = sorted(taken & set(_keys(section)))
    if clash:
        raise InvalidParameterError(
            f"Audit policy key(s) {clash} of output kind {kind!r} are declared already; give the "
            "kind's keys names of their own."
        )
    _SECTIONS[kind] = section


def unregister_section(kind: str) -> None:
    """Forget the keys `register_section` gave kind `kind`."""
    _SECTIONS.pop(kind, None)


def registered_sections() -> tuple[type, ...]:
    """Every registered section type, once (kinds may share one)."""
    return tuple(dict.fromkeys(_SECTIONS.values()))


def check_flag(name: str, value: Any) -> None:
    """A policy key that is true or false."""
    if not isinstance(value, bool):
        raise InvalidParameterError(f"audit policy {name} must be true or false, got {value!r}.")


def check_number(name: str, value: Any, *, share: bool = False, count: bool = False) -> None:
    """A numeric policy key is a finite number; a share lies in [0, 1], a count is a whole number
    >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameterError(f"audit policy {name} must be a finite number, got {value!r}.")
    if share and not 0 <= value <= 1:
        raise InvalidParameterError(f"audit policy {name} must be between 0 and 1, got {value}.")
    if count and (int(value) != value or value < 1):
        raise InvalidParameterError(f"audit policy {name} must be a positive integer, got {value}.")


def _check_bounds(name: str, value: float) -> None:
    """The bounds particular to one numeric policy field."""
    if name == "near_copy_ratio" and value <= 0:
        raise InvalidParameterError(f"audit policy near_copy_ratio must be > 0, got {value}.")
    if name == "max_fid" and value < 0:
        raise InvalidParameterError(f"audit policy max_fid must be >= 0, got {value}.")
    if name == "one_run_canaries" and value < 10:
        raise InvalidParameterError(
            f"audit policy one_run_canaries must be >= 10 (or omitted), got {value}."
        )
    if name == "sds_clusters" and value < 2:
        raise InvalidParameterError(f"audit policy sds_clusters must be >= 2, got {value}.")


# What the utility gate reveals, for the dataset card (the publication decision depends on it).
UTILITY_GATE_CHANNEL = (
    "Utility gate (uncharged channel): the release was published only because "
    "classifiers trained on it reached the required accuracy on a real held-out set "
    "that is not part of the registered dataset. The decision is a function of this DP "
    "release and of that held-out set only, so it is post-processing with respect to "
    "the registered records and spends no budget; it reveals about one bit about the "
    "held-out set (whether the release is useful on it), which carries no DP guarantee."
)
