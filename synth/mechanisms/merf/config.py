"""DP-MERF run parameters, validated up front (the plan refuses what a run could not do)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from accounting.errors import InvalidParameterError
from synth import config as check
from synth.config import MechanismConfig
from synth.tools.kernel.bandwidth import (
    BATCH,
    LR,
    NARROW_MAX_RELATIVE_NOISE,
    WIDTH,
    Z_DIM,
    auto_bandwidth,
    narrow_limit,
    pixel_noise,
    relative_noise,
)

# The "auto" settings below are decided at plan time from public quantities only (the plan's sigma,
# the registered count and label set), so deciding spends no privacy. Each limit sits between
# settings that worked and settings that did not (BENCHMARKS.md, DP-MERF; BENCHMARKS-NOTEBOOK.md,
# the DP-MERF sections and "Measurement history from the code").

# teacher_labels = "auto": DP labels where the query, left `query_share` of epsilon, still keeps
# the narrow kernel (they gained there and cost a little where the query fell to the wide one)
TEACHER_AUTO = "auto"
# perceptual_share = "auto": perceptual features take PERCEPTUAL_SHARE of each record's unit norm
# where the pixel features, left the rest, still keep the narrow kernel (narrow_limit); else off
PERCEPTUAL_AUTO = "auto"
PERCEPTUAL_SHARE = 0.5
# steps = "auto": LONG_STEPS generator updates where the pixel features' noise is at most
# LONG_STEPS_MAX_NOISE: twice the updates pay where the summary is precise, not where it is noisy
# (BENCHMARKS-NOTEBOOK.md, "A longer-trained generator at epsilon 1 and on MNIST-5k")
STEPS_AUTO = "auto"
STEPS = 2000
LONG_STEPS = 4000
LONG_STEPS_MAX_NOISE = 0.05
MAX_STEPS = 1_000_000  # 250x auto's longest: days on a CPU


@dataclass(frozen=True)
class MerfConfig(MechanismConfig):
    """One Gaussian query (the noisy random-feature embedding of each class), then a small generator
    trained against it on the publisher's machine (post-processing). `epsilon` is the target for the
    dataset's whole history, this query included; its noise is calibrated at plan time."""

    epsilon: float
    delta: float
    n_features: int = 4000  # random Fourier features (half cosines, half sines)
    bandwidth: float | None = None  # kernel bandwidth; None = chosen by auto_bandwidth
    z_dim: int = Z_DIM
    width: int = WIDTH
    steps: int | str = STEPS_AUTO  # generator updates, or "auto" (decided by the plan)
    batch: int = BATCH
    lr: float = LR
    n_samples: int = 10_000  # released, balanced over the classes
    seed: int = 0  # public: the random frequencies, the generator's initialisation and draws
    # DP labels (synth.mechanisms.merf.dp_labels): a classifier trained with DP-SGD on the sensitive
    # images
    # labels the drawn images; the query gets `query_share` of epsilon, the classifier the rest
    teacher_labels: bool | str = TEACHER_AUTO  # true, false or "auto" (decided by the plan)
    query_share: float = 0.5  # the query's noise is that of a query alone at this share of epsilon
    teacher_epochs: int = 10
    teacher_batch: int = 512  # expected records per DP-SGD step
    # perceptual features' share of each record's unit norm in the query: 0 (pixels only), a
    # number below 1, or "auto" (decided by the plan from public quantities)
    perceptual_share: float | str = PERCEPTUAL_AUTO

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # for tests: seconds, meaningless quality
        "tiny": dict(n_features=256, z_dim=8, width=8, steps=5, batch=32),
    }

    @classmethod
    def checked(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        steps = cls._checked_steps(v["steps"])
        # random features come in cosine and sine pairs
        features = check.even("n_features", v["n_features"], 64, 100_000)
        width = check.even("width", v["width"], 1, 512, "an even number of channels")
        return {
            **v,
            "epsilon": check.epsilon("target epsilon", v["epsilon"]),
            "delta": check.delta("delta", v["delta"]),
            "n_features": features,
            "bandwidth": (
                None if v["bandwidth"] is None else check.positive("bandwidth", v["bandwidth"])
            ),
            "z_dim": check.count("z_dim", v["z_dim"]),
            "width": width,
            "steps": steps,
            "batch": check.count("batch", v["batch"]),
            "lr": check.positive("lr", v["lr"], 1.0),
            "n_samples": check.whole("n_samples", v["n_samples"], 1, 10_000_000, hint="images"),
            "seed": check.whole("seed", v["seed"], 0),
            **cls._checked_teacher(v),
            "perceptual_share": cls._checked_perceptual(v["perceptual_share"]),
        }

    @staticmethod
    def _checked_steps(steps: Any) -> Any:
        """steps: "auto", or a whole number of generator updates up to MAX_STEPS."""
        if steps != STEPS_AUTO:
            if isinstance(steps, str):
                raise InvalidParameterError(
                    f'steps must be "{STEPS_AUTO}" or a positive whole number of generator '
                    f"updates, got {steps!r}."
                )
            steps = check.count("steps", steps)
            if steps > MAX_STEPS:
                raise InvalidParameterError(
                    f"steps must be at most {MAX_STEPS:,} generator updates, got {steps:,}: "
                    f"a run that long would not finish after charging (auto trains {STEPS:,} or "
                    f'{LONG_STEPS:,}). Lower `steps` or set it to "{STEPS_AUTO}".'
                )
        return steps

    @staticmethod
    def _checked_teacher(v: Mapping[str, Any]) -> dict[str, Any]:
        """The DP teacher classifier's settings and the query's share of epsilon."""
        return {
            "teacher_labels": check.choice(
                "teacher_labels", v["teacher_labels"], (True, False, TEACHER_AUTO)
            ),
            "query_share": check.number(
                "query_share",
                v["query_share"],
                0.0,
                1.0,
                low_open=True,
                high_open=True,
                hint="the query's share of epsilon, the DP classifier taking the rest",
            ),
            "teacher_epochs": check.whole("teacher_epochs", v["teacher_epochs"], 1, 1000),
            "teacher_batch": check.count("teacher_batch", v["teacher_batch"]),
        }

    @staticmethod
    def _checked_perceptual(share: Any) -> Any:
        """perceptual_share: "auto", or the perceptual features' share of each record (0 to 0.9)."""
        if share == PERCEPTUAL_AUTO:
            return share
        return check.number(
            "perceptual_share",
            share,
            0.0,
            0.9,
            hint=f'or "{PERCEPTUAL_AUTO}": the perceptual features\' share of each '
            "record in the query, 0 = pixels only",
        )

    def bandwidth_for(
        self,
        n_pixels: int,
        sigma: float,
        n_records: int,
        n_classes: int,
        perceptual_share: float = 0.0,
    ) -> float:
        """The bandwidth set, or the one auto_bandwidth picks for the noise on the pixel features
        (which keep 1 - perceptual_share of each record's squared norm)."""
        if self.bandwidth is not None:
            return self.bandwidth
        noise = pixel_noise(sigma, self.n_features, n_records, n_classes, perceptual_share)
        return auto_bandwidth(n_pixels, noise, perceptual_share)

    def perceptual_for(self, query_sigma: float, n_records: int, n_classes: int) -> float:
        """The perceptual share: the setting itself, or for "auto" PERCEPTUAL_SHARE where the pixel
        features beside it still keep the narrow kernel, else 0 (public quantities only)."""
        if self.perceptual_share != PERCEPTUAL_AUTO:
            return float(self.perceptual_share)
        noise = pixel_noise(query_sigma, self.n_features, n_records, n_classes, PERCEPTUAL_SHARE)
        return PERCEPTUAL_SHARE if noise <= narrow_limit(PERCEPTUAL_SHARE) else 0.0

    def steps_for(
        self, query_sigma: float, n_records: int, n_classes: int, perceptual_share: float
    ) -> int:
        """The generator's updates: the setting itself, or for "auto" LONG_STEPS where the pixel
        features' noise is at most LONG_STEPS_MAX_NOISE, else STEPS (public quantities only)."""
        if self.steps != STEPS_AUTO:
            return int(self.steps)
        noise = pixel_noise(query_sigma, self.n_features, n_records, n_classes, perceptual_share)
        return LONG_STEPS if noise <= LONG_STEPS_MAX_NOISE else STEPS

    def wants_teacher(self, query_sigma: float, n_records: int, n_classes: int) -> bool:
        """Whether the release trains the label classifier: the setting itself, or for "auto" a
        decision from public quantities only (the query's noise at its share of epsilon, the
        registered count and label set)."""
        if self.teacher_labels != TEACHER_AUTO:
            return bool(self.teacher_labels)
        noise = relative_noise(query_sigma, self.n_features, n_records, n_classes)
        return n_classes >= 2 and noise <= NARROW_MAX_RELATIVE_NOISE
