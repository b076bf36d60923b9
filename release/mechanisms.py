"""Adapters from a release spec to the two mechanisms: build the config, plan the events, run."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np

from accounting import ledger
from accounting.errors import InvalidParameterError
from accounting.events import event_to_json
from accounting.store import Store
from release.spec import ReleaseSpec
from synth.datasets import ImageDataset, load_source
from synth.progress import ProgressFn
from synth.result import SynthResult


def _config(spec: ReleaseSpec, cls: Any, preset_args: dict[str, Any], extra: dict[str, Any]) -> Any:
    overrides = {**spec.config_overrides(), **extra}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidParameterError(f"Unknown [{spec.mechanism}] parameter(s) {unknown}; known: {sorted(known)}.")
    if "unet_channels" in overrides:
        overrides["unet_channels"] = tuple(overrides["unet_channels"])
    if spec.preset == "default":
        return cls(**{**preset_args, **overrides})
    preset = getattr(cls, spec.preset)
    return dataclasses.replace(preset(**preset_args), **overrides) if overrides else preset(**preset_args)


def privimage_config(spec: ReleaseSpec, dataset: ledger.Dataset):
    from synth.privimage import PrivImageConfig

    params = spec.config_overrides()
    if "epsilon" not in params:
        raise InvalidParameterError("[privimage] needs `epsilon`, the target for the dataset's whole history.")
    base = {"epsilon": params.pop("epsilon"), "delta": params.pop("delta", dataset.delta_cap)}
    extra = {"n_samples": spec.n_images} if spec.n_images else {}
    cfg = _config(dataclasses.replace(spec, mechanism_params={**params, "preset": spec.preset}), PrivImageConfig,
                  base, extra)
    if cfg.delta > dataset.delta_cap:
        raise InvalidParameterError(f"[privimage] delta {cfg.delta:g} exceeds the dataset's delta cap {dataset.delta_cap:g}.")
    return cfg


def ksalsa_config(spec: ReleaseSpec):
    from synth.ksalsa import KSalsaConfig

    params = spec.config_overrides()
    if "k" not in params:
        raise InvalidParameterError("[ksalsa] needs `k`, the anonymity parameter (every image averages k records).")
    base = {"k": params.pop("k")}
    if "method" in params:
        base["method"] = params.pop("method")
    return _config(dataclasses.replace(spec, mechanism_params={**params, "preset": spec.preset}), KSalsaConfig, base, {})


def plan_mechanism(spec: ReleaseSpec, dataset: ledger.Dataset, prior: list) -> dict[str, Any]:
    """Events, expected output count, warnings and mechanism plan (JSON) for a spec."""
    if spec.mechanism == "privimage":
        from synth.privimage import plan_privimage

        cfg = privimage_config(spec, dataset)
        plan = plan_privimage(cfg, dataset.record_count, prior)
        warnings = []
        if plan.noise_multiplier < 0.5:
            warnings.append(f"DP-SGD noise multiplier {plan.noise_multiplier:.3g} is small: utility will be good but "
                            "the guarantee rests on a generous epsilon.")
        return {"events": [event_to_json(e) for e in plan.events], "expected_count": cfg.n_samples,
                "warnings": warnings, "requires_acknowledgement": False, "config": cfg.as_dict(),
                "mechanism_plan": plan.to_json(), "delta": cfg.delta}
    from synth.ksalsa import plan_ksalsa

    cfg = ksalsa_config(spec)
    plan = plan_ksalsa(cfg, dataset.record_count)
    return {"events": [event_to_json(e) for e in plan.events], "expected_count": plan.n_released,
            "warnings": list(plan.warnings), "requires_acknowledgement": True, "config": plan.to_dict()["config"],
            "mechanism_plan": plan.to_dict(), "delta": dataset.delta_cap}


def execute(store: Store, release: dict, spec: ReleaseSpec, dataset: ledger.Dataset, data: ImageDataset,
            workdir: Path, progress: ProgressFn, actor: str, acknowledged: bool) -> SynthResult:
    public = load_source(spec.public_source)
    plan = release["plan"]
    if spec.mechanism == "privimage":
        from synth.privimage import PrivImagePlan, run_privimage

        cfg = privimage_config(spec, dataset)
        return run_privimage(store, dataset.name, data, public, cfg, run_id=release["release_id"], workdir=workdir,
                             progress=progress, actor=actor, plan=PrivImagePlan.from_json(plan["mechanism_plan"]))
    from synth.ksalsa import run_ksalsa

    cfg = ksalsa_config(spec)
    return run_ksalsa(store, dataset.name, data, public, cfg, run_id=release["release_id"], workdir=workdir,
                      progress=progress, actor=actor, acknowledge_non_dp=acknowledged)


def loss_function(mechanism: str, artifacts: dict[str, str]) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """Per-sample diffusion loss of the released generator (from a stored result's artifacts), for the
    membership-inference attack; None for mechanisms that release no generator."""
    model = artifacts.get("model")
    if mechanism != "privimage" or not model:
        return None
    from synth.privimage import per_sample_diffusion_loss

    return lambda images, labels: per_sample_diffusion_loss(model, images, labels)
