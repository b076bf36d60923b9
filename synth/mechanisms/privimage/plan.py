"""The privacy plan of a PrivImage run: which events it will charge, calibrated over the whole
history."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accounting.calibration import calibrate_dpsgd_sigma
from accounting.epsilon import EpsilonReport, epsilon_report
from accounting.errors import BudgetExceededError, InvalidParameterError
from accounting.events import DpSgd, GaussianQuery, MechanismEvent, event_from_json, event_to_json
from accounting.validation import check_count
from synth.mechanisms.privimage.central import central_event, resolve_queries
from synth.mechanisms.privimage.config import CENTRAL_AUTO, PrivImageConfig
from synth.mechanisms.privimage.frequency import frequency_event, resolve_frequency


@dataclass(frozen=True)
class PrivImagePlan:
    # [query GaussianQuery, frequency GaussianQuery, central GaussianQuery, DpSgd, vote
    # GaussianQuery (count = rounds)]: the query only for selection "semantic", the frequency
    # warm-up's embedding and the central images only where on, the vote only with vote_sigma > 0
    events: list[MechanismEvent]
    noise_multiplier: float
    sample_rate: float
    steps: int
    record_count: int
    epsilon: EpsilonReport  # of prior + events
    central: bool = False  # the last Gaussian query before DP-SGD is the DP central images
    # the Gaussian query before the central images' (or before DP-SGD without them) is the
    # frequency warm-up's embedding (synth.mechanisms.privimage.frequency)
    frequency: bool = False

    def _before(self) -> list[GaussianQuery]:
        return [e for e in self.events[: self._dpsgd_index] if isinstance(e, GaussianQuery)]

    @property
    def query_event(self) -> GaussianQuery | None:
        """The semantic query: the first Gaussian query before DP-SGD that is neither the
        frequency warm-up's nor the central images'."""
        before = self._before()[: len(self._before()) - self.central - self.frequency]
        return next(iter(before), None)

    @property
    def frequency_event(self) -> GaussianQuery | None:
        """The frequency warm-up's embedding: the Gaussian query before the central images'."""
        before = self._before()[: len(self._before()) - self.central]
        return before[-1] if self.frequency and before else None

    @property
    def central_event(self) -> GaussianQuery | None:
        """The DP central images (synth.mechanisms.privimage.central): the Gaussian query just
        before
        DP-SGD."""
        event = self.events[self._dpsgd_index - 1] if self.central else None
        return event if isinstance(event, GaussianQuery) else None

    @property
    def vote_event(self) -> GaussianQuery | None:
        """The private vote on the samples: the Gaussian query after DP-SGD, `count` = its
        rounds."""
        return next(
            (e for e in self.events[self._dpsgd_index + 1 :] if isinstance(e, GaussianQuery)), None
        )

    @property
    def vote_sigmas(self) -> list[float]:
        """The noise std of each round of the vote (empty without the vote)."""
        vote = self.vote_event
        return [vote.sigma] * vote.count if vote is not None else []

    @property
    def dpsgd_event(self) -> DpSgd:
        event = self.events[self._dpsgd_index]
        assert isinstance(event, DpSgd)  # _dpsgd_index finds the DpSgd event
        return event

    @property
    def _dpsgd_index(self) -> int:
        return next(i for i, e in enumerate(self.events) if isinstance(e, DpSgd))

    @property
    def expected_batch(self) -> float:
        return self.sample_rate * self.record_count

    def to_json(self) -> dict[str, Any]:
        return {
            "events": [event_to_json(e) for e in self.events],
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "record_count": self.record_count,
            "epsilon": {
                "epsilon_rdp": self.epsilon.epsilon_rdp,
                "epsilon_pld": self.epsilon.epsilon_pld,
                "delta": self.epsilon.delta,
            },
            **({"central": True} if self.central else {}),
            **({"frequency": True} if self.frequency else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PrivImagePlan:
        return cls(
            [event_from_json(e) for e in data["events"]],
            float(data["noise_multiplier"]),
            float(data["sample_rate"]),
            int(data["steps"]),
            int(data["record_count"]),
            EpsilonReport(**data["epsilon"]),
            bool(data.get("central", False)),
            bool(data.get("frequency", False)),
        )


def sample_rate_for(record_count: int, batch_size: int) -> float:
    """Opacus' DPDataLoader samples each record with q = 1 / len(loader) = 1 / ceil(N / B); we plan
    with exactly that q so that the ledger and opacus' accountant describe the same mechanism."""
    return 1.0 / math.ceil(record_count / batch_size)


def query_event(config: PrivImageConfig) -> GaussianQuery:
    # One image adds 1 to k cells of one row: L2 sensitivity sqrt(k); noise std sqrt(k) *
    # query_sigma.
    root_k = math.sqrt(config.k)
    return GaussianQuery(sigma=root_k * config.query_sigma, sensitivity=root_k)


def vote_event(config: PrivImageConfig) -> GaussianQuery:
    # Each round, one sensitive image adds 1 to one candidate's count
    # (synth.mechanisms.privimage.vote): L2
    # sensitivity 1.
    return GaussianQuery(sigma=config.vote_sigma, sensitivity=1.0, count=config.vote_rounds)


def plan_privimage(
    config: PrivImageConfig,
    record_count: int,
    prior: Sequence[MechanismEvent] = (),
    n_classes: int | None = None,
) -> PrivImagePlan:
    """Deterministic given (config, record_count, prior, n_classes): the DP-SGD noise is the
    smallest that keeps the RDP epsilon of prior + query + central images + DP-SGD + every vote
    round <= config.epsilon. `n_classes` (the registered label count) is needed only to decide
    `central_images = "auto"`.

    Raises:
        InvalidParameterError: a batch larger than the dataset, or "auto" without `n_classes`.
    """
    n = check_count(record_count, "record count")
    if config.batch_size > n:
        raise InvalidParameterError(
            f"batch_size {config.batch_size} is larger than "
            f"the dataset ({n} records); use a smaller batch."
        )
    q = sample_rate_for(n, config.batch_size)
    steps = max(1, math.ceil(config.finetune_epochs / q))
    before, frequency, central_queries = _before_dpsgd(config, n, n_classes)
    after: list[GaussianQuery] = [vote_event(config)] if config.vote_sigma else []
    sigma = _calibrated_sigma(config, q, steps, prior, before, after, frequency, central_queries)
    events: list[MechanismEvent] = [*before, DpSgd(q, sigma, steps), *after]
    return PrivImagePlan(
        events,
        sigma,
        q,
        steps,
        n,
        epsilon_report(list(prior) + events, config.delta),
        central=bool(central_queries),
        frequency=frequency,
    )


def _before_dpsgd(
    config: PrivImageConfig, n: int, n_classes: int | None
) -> tuple[list[GaussianQuery], bool, int]:
    """The queries before DP-SGD (semantic query, frequency warm-up, central images, each where
    configured); also the frequency warm-up and central queries as resolved."""
    before: list[GaussianQuery] = [query_event(config)] if config.selection == "semantic" else []
    if CENTRAL_AUTO in (config.central_images, config.frequency_warmup) and n_classes is None:
        raise InvalidParameterError(
            'central_images and frequency_warmup = "auto" are decided from the number of classes; '
            "pass n_classes (or set them explicitly)."
        )
    central_queries = resolve_queries(
        config.central_images, config.central_sigma, config.central_clip, n, n_classes or 1
    )
    frequency = resolve_frequency(
        config.frequency_warmup,
        config.frequency_sigma,
        config.frequency_features,
        n,
        n_classes or 1,
    )
    if frequency:
        before.append(frequency_event(config.frequency_sigma))
    if central_queries:
        before.append(central_event(config.central_sigma, central_queries))
    return before, frequency, central_queries


def _calibrated_sigma(
    config: PrivImageConfig,
    q: float,
    steps: int,
    prior: Sequence[MechanismEvent],
    before: list[GaussianQuery],
    after: list[GaussianQuery],
    frequency: bool,
    central_queries: int,
) -> float:
    """The smallest DP-SGD noise within the budget; where none is, the refusal names the fixed
    costs."""
    try:
        return calibrate_dpsgd_sigma(
            config.epsilon, config.delta, q, steps, prior=list(prior), extra=before + after
        )
    except BudgetExceededError:
        named = _named(config, before + after, frequency, bool(central_queries))
        fixed = _fixed_cost(config, list(prior), named)
        if fixed is None:
            raise
        raise BudgetExceededError(fixed) from None


def _named(
    config: PrivImageConfig, events: list[GaussianQuery], frequency: bool, central: bool
) -> list[tuple[str, MechanismEvent]]:
    """The set-noise events with their names, in the order plan_privimage builds them."""
    names = (
        [f"the semantic query (query_sigma {config.query_sigma:g})"]
        if config.selection == "semantic"
        else []
    )
    if frequency:
        names.append(f"the frequency warm-up (frequency_sigma {config.frequency_sigma:g})")
    if central:
        names.append(f"the central images (central_sigma {config.central_sigma:g})")
    if config.vote_sigma:
        rounds = config.vote_rounds
        plural = "s" if rounds > 1 else ""
        names.append(
            f"the private vote ({rounds} round{plural} at vote_sigma {config.vote_sigma:g})"
        )
    return list(zip(names, events, strict=True))


def _fixed_cost(
    config: PrivImageConfig, prior: list[MechanismEvent], named: list[tuple[str, MechanismEvent]]
) -> str | None:
    """Where the run's set-noise events alone (with the prior spend) exceed the target: which of
    them take it, each alone (RDP, as calibrated). None where they fit and DP-SGD is the cost, or
    where the prior spend alone leaves nothing (the accountant's own message says so)."""
    if prior and epsilon_report(prior, config.delta).epsilon_rdp >= config.epsilon:
        return None
    spent = epsilon_report(prior + [e for _, e in named], config.delta).epsilon_rdp
    if spent <= config.epsilon:
        return None
    parts = ", ".join(
        f"{name}: {epsilon_report([e], config.delta).epsilon_rdp:.3g}" for name, e in named
    )
    earlier = f" with the {len(prior)} earlier events" if prior else ""
    return (
        f"Before any DP-SGD step this plan's other events{earlier} spend epsilon {spent:.3g}, "
        f"more than the target {config.epsilon:g} ({parts}). Give them more noise (a larger "
        "sigma; `--vote-sigma 0`, or `vote_sigma = 0` in a spec, turns the vote off) or raise the "
        "target epsilon."
    )
