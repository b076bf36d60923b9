"""Mechanism events: what ran on a dataset, as parameters, in Google dp-accounting's DpEvent form.

An event is stored as JSON holding both our readable parameters and the DpEvent tree, e.g.

    {"mechanism": "dpsgd",
     "params": {"sample_rate": 0.01, "noise_multiplier": 1.1, "steps": 500},
     "dp_event": {"type": "SelfComposedDpEvent", "count": 500,
                  "event": {"type": "PoissonSampledDpEvent", "sampling_probability": 0.01,
                            "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.1}}}}

so anyone can rebuild the DpEvent with dp-accounting alone and recompute epsilon independently.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import attr
import dp_accounting
from dp_accounting import dp_event as dpe

from accounting.errors import InvalidParameterError
from accounting.validation import check_count, check_sample_rate, check_sensitivity, check_sigma


# ---------------------------------------------------------------- DpEvent <-> JSON (generic)
def dp_event_to_json(event: dpe.DpEvent) -> dict[str, Any]:
    """Serialise any dp-accounting DpEvent (attrs classes) to plain JSON data."""
    out: dict[str, Any] = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dpe.DpEvent):
            value = dp_event_to_json(value)
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], dpe.DpEvent):
            value = [dp_event_to_json(v) for v in value]
        out[field.name] = value
    return out


def dp_event_from_json(data: dict[str, Any]) -> dpe.DpEvent:
    """Inverse of dp_event_to_json; refuses unknown event types."""
    name = data.get("type")
    cls = getattr(dpe, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, dpe.DpEvent)):
        raise InvalidParameterError(f"Unknown DpEvent type {name!r} in stored event.")
    kwargs = {}
    for key, value in data.items():
        if key == "type":
            continue
        if isinstance(value, dict) and "type" in value:
            value = dp_event_from_json(value)
        elif (
            isinstance(value, list) and value and isinstance(value[0], dict) and "type" in value[0]
        ):
            value = [dp_event_from_json(v) for v in value]
        kwargs[key] = value
    return cls(**kwargs)


# ---------------------------------------------------------------- our mechanisms
@dataclass(frozen=True)
class GaussianQuery:
    """A query answered with Gaussian noise of standard deviation `sigma` and L2 `sensitivity`,
    released `count` times. The DpEvent only needs the ratio sigma/sensitivity."""

    sigma: float
    sensitivity: float = 1.0
    count: int = 1
    mechanism = "gaussian_query"

    def __post_init__(self) -> None:
        check_sensitivity(self.sigma, "Gaussian query sigma (noise std)")
        check_sensitivity(self.sensitivity, "Gaussian query L2 sensitivity")
        check_sigma(
            self.sigma / self.sensitivity, "Gaussian query noise multiplier (sigma / sensitivity)"
        )
        check_count(self.count, "Gaussian query count")

    @property
    def noise_multiplier(self) -> float:
        return float(self.sigma) / float(self.sensitivity)

    def to_dp_event(self) -> dpe.DpEvent:
        return _self_composed(dp_accounting.GaussianDpEvent(self.noise_multiplier), self.count)

    def describe(self) -> str:
        return (
            f"Gaussian query sigma={self.sigma:g}, sensitivity={self.sensitivity:g} x{self.count}"
        )


@dataclass(frozen=True)
class DpSgd:
    """DP-SGD: `steps` Poisson-sampled (rate q) Gaussian mechanisms with noise multiplier sigma."""

    sample_rate: float
    noise_multiplier: float
    steps: int
    mechanism = "dpsgd"

    def __post_init__(self) -> None:
        check_sample_rate(self.sample_rate)
        check_sigma(self.noise_multiplier, "DP-SGD noise multiplier sigma")
        check_count(self.steps, "DP-SGD steps")

    def to_dp_event(self) -> dpe.DpEvent:
        inner = dp_accounting.PoissonSampledDpEvent(
            float(self.sample_rate), dp_accounting.GaussianDpEvent(float(self.noise_multiplier))
        )
        return _self_composed(inner, self.steps)

    def describe(self) -> str:
        return f"DP-SGD q={self.sample_rate:g}, sigma={self.noise_multiplier:g}, steps={self.steps}"


@dataclass(frozen=True)
class NonPrivateRelease:
    """A release with no DP guarantee (e.g. k-anonymous averages). Composing it makes epsilon
    infinite: after it the dataset's DP guarantees no longer hold (ARCHITECTURE.md rule 5)."""

    reason: str
    mechanism = "non_private"

    def to_dp_event(self) -> dpe.DpEvent:
        return dp_accounting.NonPrivateDpEvent()

    def describe(self) -> str:
        return f"non-private release ({self.reason})"


MechanismEvent = GaussianQuery | DpSgd | NonPrivateRelease
_KINDS = {cls.mechanism: cls for cls in (GaussianQuery, DpSgd, NonPrivateRelease)}


def _self_composed(event: dpe.DpEvent, count: int) -> dpe.DpEvent:
    return event if count == 1 else dp_accounting.SelfComposedDpEvent(event, int(count))


def event_to_json(event: MechanismEvent) -> dict[str, Any]:
    return {
        "mechanism": event.mechanism,
        "params": asdict(event),
        "dp_event": dp_event_to_json(event.to_dp_event()),
    }


def event_from_json(data: dict[str, Any]) -> MechanismEvent:
    """Rebuild an event; the stored DpEvent must agree with the parameters (it is what auditors
    recompute)."""
    cls = _KINDS.get(data.get("mechanism", ""))
    if cls is None:
        raise InvalidParameterError(f"Unknown mechanism {data.get('mechanism')!r} in stored event.")
    event = cls(**data["params"])
    if "dp_event" in data and data["dp_event"] != dp_event_to_json(event.to_dp_event()):
        raise InvalidParameterError(
            f"Stored DpEvent does not match the parameters of {event.describe()}."
        )
    return event


def events_to_text(events: Iterable[MechanismEvent]) -> str:
    return json.dumps([event_to_json(e) for e in events], sort_keys=True)


def events_from_text(text: str) -> list[MechanismEvent]:
    return [event_from_json(d) for d in json.loads(text)]


def compose(events: Iterable[MechanismEvent]) -> dpe.DpEvent:
    """The whole history as one ComposedDpEvent. Identical events are grouped into one
    SelfComposedDpEvent: the same privacy loss by definition of composition, but a 10,000-event
    history costs one accountant call per distinct event instead of one per event."""
    counts = Counter(e.to_dp_event() for e in events)
    parts = [_self_composed(ev, n) if n > 1 else ev for ev, n in counts.items()]
    return dp_accounting.ComposedDpEvent(parts)
