"""What a DP-MERF plan decides, once, from public inputs only (the calibrated sigma, the registered
image shape, record count and label count): the generator's size, the kernel's bandwidth, the
perceptual share and the step count. The plan stores them in its detail; the run reads them back
from the approved plan instead of deciding again, so what runs is what was approved."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accounting.errors import InvalidParameterError
from synth.mechanisms.merf.config import MerfConfig
from synth.tools.kernel.fit import generator_size


@dataclass(frozen=True)
class MerfDecisions:
    sigma: float
    generator_size: int
    bandwidth: float
    perceptual_share: float
    steps: int

    @classmethod
    def decide(
        cls,
        config: MerfConfig,
        sigma: float,
        geometry: tuple[int, int, int],
        n_records: int,
        n_classes: int,
    ) -> MerfDecisions:
        """The plan's choices for images of (height, width, channels) `geometry`."""
        h, w, channels = geometry
        size = generator_size(h, w)
        perceptual = config.perceptual_for(sigma, n_records, n_classes)
        bandwidth = config.bandwidth_for(
            channels * size * size, sigma, n_records, n_classes, perceptual
        )
        steps = config.steps_for(sigma, n_records, n_classes, perceptual)
        return cls(float(sigma), size, float(bandwidth), float(perceptual), int(steps))

    def as_detail(self) -> dict[str, Any]:
        return {
            "sigma": self.sigma,
            "generator_size": self.generator_size,
            "bandwidth": self.bandwidth,
            "perceptual_share": self.perceptual_share,
            "steps": self.steps,
        }

    @classmethod
    def from_detail(cls, detail: Mapping[str, Any], sigma: float) -> MerfDecisions:
        """The approved plan's decisions; `sigma` is the one its charged query carries (they must
        agree: the detail and the events are signed together, but a plan is data)."""
        fields: Sequence[str] = tuple(cls(0, 0, 0, 0, 0).as_detail())
        missing = [f for f in fields if f not in detail]
        if missing:
            raise InvalidParameterError(
                f"This DP-MERF plan does not record its {', '.join(missing)} (a plan made by an "
                "older version). Plan and approve the release again."
            )
        decided = cls(
            float(detail["sigma"]),
            int(detail["generator_size"]),
            float(detail["bandwidth"]),
            float(detail["perceptual_share"]),
            int(detail["steps"]),
        )
        if decided.sigma != float(sigma):
            raise InvalidParameterError(
                f"This DP-MERF plan records sigma {decided.sigma} but charges a query of sigma "
                f"{sigma}: the plan is inconsistent. Plan and approve the release again."
            )
        return decided
