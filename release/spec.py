"""Release specs (TOML): what to run, on which dataset, with which guarantee and audit policy.

[release]
dataset = "mnist"
mechanism = "NAME"             # a registered mechanism (synth.registry.names())
n_images = 1000                # rows to make; k-anonymous releases give floor(n/k) instead
heldout = "data/heldout"       # optional real held-out data (built-in datasets have one)
description = "synthetic digits for model prototyping"

[NAME]                         # the mechanism's config fields; preset = default | demo | tiny
public = "builtin:public-pool"
epsilon = 5.0
delta = 1e-5                   # optional: defaults to the dataset's delta cap
preset = "demo"

[policy]                       # audit.AuditPolicy thresholds
mia_max_auc = 0.6
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accounting.errors import InvalidParameterError
from accounting.events import event_from_json
from synth import registry
from synth.registry import MechanismPlan


@dataclass(frozen=True)
class ReleaseSpec:
    dataset: str
    mechanism: str
    n_images: int | None
    description: str
    mechanism_params: dict[str, Any]
    policy: dict[str, Any] = field(default_factory=dict)
    # real held-out data of the same distribution, for attacks and utility
    heldout: str | None = None
    license: str | None = None  # the dataset card's license id (e.g. cc-by-4.0); None: "other"
    source_file: str | None = None  # the TOML file it was read from (not part of the spec itself)

    @property
    def public_source(self) -> str | None:
        """The public data the spec names, else its mechanism's default; None: the mechanism reads
        no public data and the spec names none."""
        source = self.mechanism_params.get("public", registry.get(self.mechanism).default_public)
        return None if source is None else str(source)

    @property
    def preset(self) -> str:
        return str(self.mechanism_params.get("preset", "default"))

    def config_overrides(self) -> dict[str, Any]:
        return {k: v for k, v in self.mechanism_params.items() if k not in ("public", "preset")}

    def as_dict(self) -> dict[str, Any]:
        rel: dict[str, Any] = {
            "dataset": self.dataset,
            "mechanism": self.mechanism,
            "description": self.description,
        }
        rel.update(
            {
                k: v
                for k, v in (
                    ("n_images", self.n_images),
                    ("heldout", self.heldout),
                    ("license", self.license),
                )
                if v is not None
            }
        )
        return {
            "release": rel,
            self.mechanism: dict(self.mechanism_params),
            "policy": dict(self.policy),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReleaseSpec:
        rel = data.get("release")
        if not isinstance(rel, dict):
            raise InvalidParameterError(
                "The spec needs a [release] table with `dataset` and `mechanism`."
            )
        unknown = set(rel) - {
            "dataset",
            "mechanism",
            "n_images",
            "description",
            "heldout",
            "license",
        }
        if unknown:
            raise InvalidParameterError(f"Unknown key(s) in [release]: {sorted(unknown)}.")
        dataset, mechanism = rel.get("dataset"), rel.get("mechanism")
        if not isinstance(dataset, str) or not dataset:
            raise InvalidParameterError("[release] dataset must name a registered dataset.")
        if mechanism not in registry.names():
            raise InvalidParameterError(
                f"[release] mechanism must be one of {registry.names()}, got {mechanism!r}."
            )
        n = rel.get("n_images")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidParameterError(
                f"[release] n_images must be a positive integer, got {n!r}."
            )
        other = [m for m in registry.names() if m != mechanism and m in data]
        if other:
            raise InvalidParameterError(
                f"The spec is for {mechanism} but also has a [{other[0]}] table; remove it."
            )
        extra = set(data) - {"release", "policy", mechanism}
        if extra:
            raise InvalidParameterError(f"Unknown table(s) in the spec: {sorted(extra)}.")
        params = dict(data.get(mechanism) or {})
        if not isinstance(data.get("policy", {}), dict):
            raise InvalidParameterError(
                "[policy] must be a table of audit thresholds, e.g. a `[policy]` line followed by "
                "`mia_max_auc = 0.6`; remove it to use the default policy."
            )
        registry.check_preset(mechanism, params.get("preset", "default"))
        heldout = rel.get("heldout")
        if heldout is not None and not isinstance(heldout, str):
            raise InvalidParameterError(
                "[release] heldout must be a data source (folder, .parquet, .npz, builtin:...)."
            )
        return cls(
            dataset,
            mechanism,
            n,
            str(rel.get("description", "")),
            params,
            dict(data.get("policy") or {}),
            heldout,
            license=_license(rel.get("license")),
        )

    @classmethod
    def from_toml(cls, path: Path) -> ReleaseSpec:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise InvalidParameterError(f"Spec file {path} does not exist.") from exc
        except tomllib.TOMLDecodeError as exc:
            raise InvalidParameterError(f"Spec file {path} is not valid TOML: {exc}.") from exc
        spec = cls.from_dict(data)
        return cls(**{**spec.__dict__, "source_file": str(Path(path).resolve())})


def canonical(obj: Any) -> bytes:
    """The audit trail's canonical JSON, as bytes (what digests and signatures cover)."""
    from accounting.trail import canonical as trail_canonical

    return trail_canonical(obj).encode()


def digest(obj: Any) -> str:
    return hashlib.sha256(canonical(obj)).hexdigest()


@dataclass(frozen=True)
class Plan:
    """A stored plan. Its digest (what the steward signs) binds everything a run reads: the whole
    spec (mechanism table and [policy]), the public data reference and content hash, the dataset id
    and fingerprint, the events and the spec file's content."""

    release_id: str
    dataset_id: str
    dataset: str
    dataset_fingerprint: str
    mechanism: str
    spec: dict[str, Any]
    spec_file: str | None
    events: list[dict[str, Any]]
    events_described: list[str]
    epsilon_before: dict[str, float | None]  # EpsilonReport.as_dict: None for infinite
    epsilon_after: dict[str, float | None]
    epsilon_cap: float
    remaining_after_rdp: float | None
    expected_count: int
    output_shape: list[int]
    warnings: list[str]
    requires_acknowledgement: bool
    guarantee_kind: str
    config: dict[str, Any]
    mechanism_plan: dict[str, Any]
    public_source: str | None  # None: the mechanism reads no public data
    public_sha256: str | None
    ledger_position: int

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.__dict__, allow_nan=False))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)

    @property
    def digest(self) -> str:
        return digest(self.to_json())

    def mechanism_view(self) -> MechanismPlan:
        """The plan as the mechanism made it (what the runner reserves and the mechanism reads)."""
        return MechanismPlan(
            events=tuple(event_from_json(e) for e in self.events),
            expected_count=self.expected_count,
            output_shape=tuple(self.output_shape),
            guarantee_kind=self.guarantee_kind,
            warnings=tuple(self.warnings),
            requires_acknowledgement=self.requires_acknowledgement,
            parameters=self.config,
            detail=self.mechanism_plan,
        )


_LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")


def _license(value: Any) -> str | None:
    """[release] license: the identifier the dataset card declares (Hugging Face/SPDX style,
    lowercase)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _LICENSE_ID.fullmatch(value):
        raise InvalidParameterError(
            "[release] license must be a lowercase license identifier such as 'cc-by-4.0', "
            f"'cc0-1.0' or 'other', got {value!r}."
        )
    return value
