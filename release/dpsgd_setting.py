"""The DP-SGD run a spec would execute now, as the one-run implementation audit trains it
(`privrelease audit implementation`, audit/dpsgd_audit.py). Stores nothing, reads no sensitive
data, charges nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from accounting import ledger
from accounting.errors import InvalidParameterError
from accounting.store import Store
from release.planning import mechanism_config, mechanism_plan
from release.spec import ReleaseSpec
from synth import registry
from synth.kinds.datasets import ImageDataset, load_public

if TYPE_CHECKING:
    from audit.dpsgd_audit import DpSgdSetting


def _check_trainer(spec: ReleaseSpec, name: str) -> None:
    """Refused before the setting is built: a mechanism may plan DP-SGD (a DP label classifier) it
    registers no trainer for, and its config then has no clipping norm or learning rate to read."""
    if registry.get(spec.mechanism).dpsgd_trainer is None:
        auditable = [n for n in registry.names() if registry.get(n).dpsgd_trainer is not None]
        raise InvalidParameterError(
            f"{name or 'the spec'}: mechanism {spec.mechanism!r} registers no DP-SGD trainer for "
            "the implementation audit to run on canaries, so the audit cannot check any DP-SGD "
            f"its release trains; it applies to {', '.join(auditable)}."
        )


def dpsgd_setting(
    store: Store, spec: ReleaseSpec, name: str = ""
) -> tuple[DpSgdSetting, ImageDataset]:
    """The DP-SGD run `spec` would execute now (the plan's q, sigma, steps; the config's clipping,
    learning rate and EMA) and the public data it names: what the one-run implementation audit
    trains. `name` labels the setting (the spec file's path).

    Raises:
        InvalidParameterError: the spec's mechanism registers no DP-SGD trainer for the audit, or
            its plan runs no DP-SGD.
    """
    from audit.dpsgd_audit import DpSgdSetting

    _check_trainer(spec, name)
    budget = ledger.budget(store, spec.dataset)
    public = load_public(spec.public_source, budget.dataset.source)
    cfg = mechanism_config(spec, budget.dataset)
    event = mechanism_plan(spec, budget, public).step_event
    if event is None:
        raise InvalidParameterError(
            f"{name or 'the spec'}: mechanism {spec.mechanism!r} runs no DP-SGD, so there is no "
            "implementation to audit; give the spec of a mechanism that trains with DP-SGD."
        )
    return DpSgdSetting(
        event.sample_rate,
        event.noise_multiplier,
        event.steps,
        cfg.max_grad_norm,
        cfg.delta,
        cfg.lr,
        cfg.ema_decay,
        f"{Path(name).name}: {event.describe()}" if name else event.describe(),
        getattr(cfg, "dp_optimizer", "adam"),
        getattr(cfg, "noise_multiplicity", 1),
        spec.mechanism,
    ), registry.images_only(public, "The implementation audit")
