"""Release specs (TOML): what to run, on which dataset, with which guarantee and audit policy.

    [release]
    dataset = "mnist"
    mechanism = "privimage"        # or "ksalsa"
    n_images = 1000                # PrivImage samples; k-anonymous releases give floor(n/k) instead
    heldout = "data/heldout"       # optional real held-out data (built-in datasets have one)
    description = "synthetic digits for model prototyping"

    [privimage]                    # PrivImageConfig fields; preset = default | demo | tiny
    public = "builtin:public-pool"
    epsilon = 5.0
    delta = 1e-5                   # optional: defaults to the dataset's delta cap
    preset = "demo"

    [ksalsa]                       # KSalsaConfig fields; preset = default | demo | tiny
    public = "builtin:uci-digits"
    k = 5
    method = "ksalsa"

    [policy]                       # audit.AuditPolicy thresholds
    mia_max_auc = 0.6
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accounting.errors import InvalidParameterError

MECHANISMS = ("privimage", "ksalsa")
PRESETS = ("default", "demo", "tiny")


@dataclass(frozen=True)
class ReleaseSpec:
    dataset: str
    mechanism: str
    n_images: int | None
    description: str
    mechanism_params: dict[str, Any]
    policy: dict[str, Any] = field(default_factory=dict)
    heldout: str | None = None      # real held-out data of the same distribution, for attacks and utility

    @property
    def public_source(self) -> str:
        return str(self.mechanism_params.get("public", "builtin:public-pool" if self.mechanism == "privimage"
                                              else "builtin:uci-digits"))

    @property
    def preset(self) -> str:
        return str(self.mechanism_params.get("preset", "default"))

    def config_overrides(self) -> dict[str, Any]:
        return {k: v for k, v in self.mechanism_params.items() if k not in ("public", "preset")}

    def as_dict(self) -> dict[str, Any]:
        rel = {"dataset": self.dataset, "mechanism": self.mechanism, "description": self.description}
        rel.update({k: v for k, v in (("n_images", self.n_images), ("heldout", self.heldout)) if v is not None})
        return {"release": rel,
                self.mechanism: dict(self.mechanism_params), "policy": dict(self.policy)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReleaseSpec":
        rel = data.get("release")
        if not isinstance(rel, dict):
            raise InvalidParameterError("The spec needs a [release] table with `dataset` and `mechanism`.")
        unknown = set(rel) - {"dataset", "mechanism", "n_images", "description", "heldout"}
        if unknown:
            raise InvalidParameterError(f"Unknown key(s) in [release]: {sorted(unknown)}.")
        dataset, mechanism = rel.get("dataset"), rel.get("mechanism")
        if not isinstance(dataset, str) or not dataset:
            raise InvalidParameterError("[release] dataset must name a registered dataset.")
        if mechanism not in MECHANISMS:
            raise InvalidParameterError(f"[release] mechanism must be one of {MECHANISMS}, got {mechanism!r}.")
        n = rel.get("n_images")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidParameterError(f"[release] n_images must be a positive integer, got {n!r}.")
        other = [m for m in MECHANISMS if m != mechanism and m in data]
        if other:
            raise InvalidParameterError(f"The spec is for {mechanism} but also has a [{other[0]}] table; remove it.")
        extra = set(data) - {"release", "policy", mechanism}
        if extra:
            raise InvalidParameterError(f"Unknown table(s) in the spec: {sorted(extra)}.")
        params = dict(data.get(mechanism) or {})
        if params.get("preset", "default") not in PRESETS:
            raise InvalidParameterError(f"[{mechanism}] preset must be one of {PRESETS}, got {params.get('preset')!r}.")
        heldout = rel.get("heldout")
        if heldout is not None and not isinstance(heldout, str):
            raise InvalidParameterError("[release] heldout must be a data source (folder, .parquet, .npz, builtin:...).")
        return cls(dataset, mechanism, n, str(rel.get("description", "")), params, dict(data.get("policy") or {}),
                   heldout)

    @classmethod
    def from_toml(cls, path: Path) -> "ReleaseSpec":
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise InvalidParameterError(f"Spec file {path} does not exist.") from exc
        except tomllib.TOMLDecodeError as exc:
            raise InvalidParameterError(f"Spec file {path} is not valid TOML: {exc}.") from exc
        return cls.from_dict(data)
