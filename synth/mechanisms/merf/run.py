"""`mechanism = "merf"`: DP-MERF released directly. One Gaussian query charged, a generator trained
on the publisher's machine against its answer, `n_samples` images drawn from it (a first release of
any data set in minutes, and the baseline every PrivImage release must beat)."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accounting.calibration import calibrate_dpsgd_sigma, calibrate_gaussian_sigma
from accounting.errors import BudgetExceededError, DataFormatError, InvalidParameterError
from accounting.events import DpSgd, GaussianQuery, MechanismEvent
from synth import registry
from synth.kinds.datasets import ImageDataset
from synth.mechanisms.merf import admission
from synth.mechanisms.merf import dp_labels as teacher
from synth.mechanisms.merf.config import (
    LONG_STEPS,
    PERCEPTUAL_AUTO,
    STEPS_AUTO,
    TEACHER_AUTO,
    MerfConfig,
)
from synth.mechanisms.merf.decisions import MerfDecisions
from synth.mechanisms.merf.describe import describe
from synth.mechanisms.merf.feature_sums import SumsJob, chunk_sums, exact_sums
from synth.registry import DatasetInfo, MechanismOutput, MechanismPlan, RunContext
from synth.tools import step_counter
from synth.tools.kernel.bandwidth import WIDE_BANDWIDTH_PER_PIXEL
from synth.tools.kernel.embedding import SENSITIVITY, embedding_event, features
from synth.tools.kernel.fit import (
    CHECK_PER_CLASS,
    CollapseCheck,
    FittedMerf,
    MerfSettings,
    fit,
    generator_size,
    to_unit,
)
from synth.tools.kernel.generator import ConditionalGenerator, draw

GENERATOR_DIR = "merf-generator"  # in the run's workdir: weights and settings, for the audit's MIA


def settings(
    config: MerfConfig, bandwidth: float, perceptual_share: float, steps: int
) -> MerfSettings:
    return MerfSettings(
        n_features=config.n_features,
        bandwidth=bandwidth,
        z_dim=config.z_dim,
        width=config.width,
        steps=steps,
        batch=config.batch,
        lr=config.lr,
        seed=config.seed,
        perceptual_share=perceptual_share,
    )


def make_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> MerfConfig:
    params = dict(params)
    params.pop("public", None)  # DP-MERF uses no public data
    base: dict[str, Any] = {"epsilon": params.pop("epsilon", None), "delta": dataset.delta_cap}
    if base["epsilon"] is None:
        raise InvalidParameterError(
            "[merf] needs `epsilon`, the target for the dataset's whole history (this release "
            "included)."
        )
    if n_images is not None:
        base["n_samples"] = n_images
    return registry.build_config(MerfConfig, "merf", preset, base, params)


def _geometry(shape: Sequence[int]) -> tuple[int, int, int]:
    """(height, width, channels) of the registered images; 1 or 3 channels."""
    if len(shape) not in (2, 3):
        raise InvalidParameterError(f"DP-MERF needs 2D images, got shape {list(shape)}.")
    channels = 1 if len(shape) == 2 else int(shape[-1])
    if channels not in (1, 3):
        raise InvalidParameterError(f"DP-MERF needs 1 or 3 channels, got {channels}.")
    return int(shape[0]), int(shape[1]), channels


def plan(
    config: MerfConfig,
    dataset: DatasetInfo,
    prior: Sequence[MechanismEvent],
    public: ImageDataset | None,
) -> MechanismPlan:
    if not isinstance(config, MerfConfig):
        raise InvalidParameterError(f"config must be a MerfConfig, got {type(config).__name__}.")
    geometry = _geometry(dataset.image_shape)
    query, dpsgd, teacher_detail = _events(config, dataset.record_count, len(dataset.labels), prior)
    sigma = query.sigma
    decided = MerfDecisions.decide(
        config, sigma, geometry, dataset.record_count, len(dataset.labels)
    )
    per_class = dataset.record_count / max(len(dataset.labels), 1)
    warnings = []
    if sigma / per_class > 0.05:  # the noise on a class's mean embedding, per unit of signal
        warnings.append(
            f"Noise std {sigma:.3g} against classes of about {per_class:.0f} records: the noisy "
            "embedding is mostly noise and the images will show little of the data. Raise epsilon "
            "or release from a larger dataset."
        )
    pixels = geometry[2] * decided.generator_size**2
    _admit(
        config,
        dataset.image_shape,
        dataset.record_count,
        len(dataset.labels),
        decided.bandwidth,
        decided.perceptual_share,
        dpsgd is not None,
    )
    return MechanismPlan(
        events=(query,) if dpsgd is None else (query, dpsgd),
        expected_count=config.n_samples,
        output_shape=tuple(dataset.image_shape),
        guarantee_kind=registry.DP,
        warnings=tuple(warnings),
        parameters=config.as_dict(),
        detail={
            **decided.as_detail(),
            "sensitivity": SENSITIVITY,
            **teacher_detail,
            "choices": _choices(
                config,
                pixels,
                decided.bandwidth,
                decided.perceptual_share,
                dpsgd is not None,
                decided.steps,
            ),
        },
    )


def _admit(
    config: MerfConfig,
    image_shape: Sequence[int],
    n_records: int,
    n_classes: int,
    bandwidth: float,
    perceptual: float,
    labels: bool,
) -> None:
    """Refuse a run that could not finish on this machine (admission.py): asked by the plan, and by
    the run again before it reads the data (the machine may differ; a refusal there is refunded)."""
    h, w, c = _geometry(image_shape)
    size = generator_size(h, w)
    admission.check_bandwidth(bandwidth, c * size * size)
    admission.check_memory(
        admission.memory_estimate(
            image_shape=tuple(int(d) for d in image_shape),
            n_records=n_records,
            n_classes=n_classes,
            size=size,
            n_features=config.n_features,
            z_dim=config.z_dim,
            width=config.width,
            batch=config.batch,
            n_samples=config.n_samples,
            perceptual_share=perceptual,
            teacher_batch=config.teacher_batch if labels else None,
        )
    )


def _choices(
    config: MerfConfig,
    n_pixels: int,
    bandwidth: float,
    perceptual: float,
    labels: bool,
    steps: int,
) -> list[str]:
    """The plan's choices in a steward's words (shown before approval; says which "auto" made,
    from the plan's noise and the registered class sizes)."""

    def how(setting: object) -> str:
        auto = (PERCEPTUAL_AUTO, TEACHER_AUTO, STEPS_AUTO, None)
        return "; chosen by auto" if setting in auto else ""

    narrow = bandwidth < WIDE_BANDWIDTH_PER_PIXEL * n_pixels
    longer = " (twice the usual: measured better where the summary is precise)"
    return [
        f"kernel: {'narrow' if narrow else 'wide'} (bandwidth {bandwidth:g}: "
        f"{'finer detail' if narrow else 'class averages, robust to noise'})"
        + how(config.bandwidth),
        (
            f"perceptual features: {perceptual:.0%} of each image's vector (a public network's "
            "texture statistics; the generator trains about 3x as long)"
            if perceptual
            else "perceptual features: off (pixels only)"
        )
        + how(config.perceptual_share),
        (
            "DP labels: on (a DP-SGD classifier labels the drawn images: the second event)"
            if labels
            else "DP labels: off (each image keeps the class it was drawn for)"
        )
        + how(config.teacher_labels),
        f"generator: {steps} updates{longer if steps == LONG_STEPS else ''}" + how(config.steps),
    ]


def _events(
    config: MerfConfig, n_records: int, n_classes: int, prior: Sequence[MechanismEvent]
) -> tuple[GaussianQuery, DpSgd | None, dict[str, Any]]:
    """The query alone at the whole target; or, with DP labels, the query at the noise of a query
    alone at `query_share` of epsilon and the classifier's DP-SGD calibrated so that the history,
    this release's two events included, meets the target. "auto" decides from public quantities
    (MerfConfig.wants_teacher), and falls back to the query alone where the two events cannot
    meet the target beside the prior spend."""
    if config.teacher_labels is not False:
        share = config.query_share * config.epsilon
        query = embedding_event(calibrate_gaussian_sigma(share, config.delta, SENSITIVITY))
        if config.wants_teacher(query.sigma, n_records, n_classes):
            q, steps = teacher.schedule(n_records, config.teacher_batch, config.teacher_epochs)
            try:
                noise = calibrate_dpsgd_sigma(
                    config.epsilon, config.delta, q, steps, prior, extra=[query]
                )
            except BudgetExceededError:
                if config.teacher_labels is True:
                    raise
            else:
                detail = {
                    "teacher_labels": True,
                    "teacher_sample_rate": q,
                    "teacher_steps": steps,
                    "teacher_noise_multiplier": noise,
                }
                return query, DpSgd(q, noise, steps), detail
    sigma = calibrate_gaussian_sigma(config.epsilon, config.delta, SENSITIVITY, prior)
    return embedding_event(sigma), None, {"teacher_labels": False}


def _planned(ctx: RunContext, config: MerfConfig) -> tuple[float, DpSgd | None]:
    """The query's sigma and, with DP labels, the classifier's DP-SGD, exactly as charged ("auto"
    was decided by the plan: its events say which)."""
    events = list(ctx.plan.events)
    if config.teacher_labels == TEACHER_AUTO:
        allowed: tuple[int, ...] = (1, 2)
    else:
        allowed = (2,) if config.teacher_labels else (1,)
    if (
        len(events) not in allowed
        or not isinstance(events[0], GaussianQuery)
        or (len(events) == 2 and not isinstance(events[1], DpSgd))
    ):
        raise InvalidParameterError(
            "A merf plan charges one Gaussian query (and, with teacher_labels, one DP-SGD run); "
            "this plan does not match its settings. Plan the release again."
        )
    return float(events[0].sigma), events[1] if len(events) == 2 else None  # type: ignore[return-value]


def run(config: MerfConfig, data: ImageDataset, ctx: RunContext) -> MechanismOutput:
    h, w, channels = _geometry(data.image_shape)
    sigma, dpsgd = _planned(ctx, config)
    values = list(data.label_set)
    # what the approved plan decided (from public inputs), read back, not decided again
    decided = MerfDecisions.from_detail(ctx.plan.detail, sigma)
    size, bandwidth = decided.generator_size, decided.bandwidth
    perceptual, steps = decided.perceptual_share, decided.steps
    n, n_classes = len(data.labels), len(values)
    # asked again before reading: this machine may not be the one that planned
    _admit(config, data.image_shape, n, n_classes, bandwidth, perceptual, dpsgd is not None)
    started = time.time()
    ctx.on_sensitive_access()
    rows = _label_rows(data, values)
    model: torch.nn.Module | None = None
    check: CollapseCheck | None = None
    if dpsgd is not None:  # the classifier first: it also checks the generator for a collapse
        model = _train_classifier(data.images, rows, len(values), size, dpsgd, config, ctx)
        check = functools.partial(_unrecognised, model, size, len(values), config.seed)
    chosen = settings(config, bandwidth, perceptual, steps)
    job = SumsJob(chosen, channels * size * size, len(values), size)
    fitted = fit(
        data.images,
        rows,
        len(values),
        sigma,
        chosen,
        ctx.progress,
        also_collapsed=check,
        exact_sums=lambda fmap: exact_sums(ctx, job, data.images, rows, fmap),
    )
    trained = time.time() - started
    out_rows = np.sort(np.arange(config.n_samples) % len(values))
    ctx.progress("drawing images", 0, 1)
    images = fitted.draw(out_rows, config.seed + 1, (h, w))
    ctx.progress("drawing images", 1, 1)
    labelled: dict[str, Any] = {}
    if model is not None and dpsgd is not None:
        out_rows, images, labelled = _label(model, size, dpsgd, images, out_rows)
    generator = _save_generator(ctx.workdir, fitted, config, channels, bandwidth)
    return MechanismOutput(
        images=images,
        labels=np.asarray(values, dtype=np.int64)[out_rows],
        parameters=_parameters(
            config,
            sigma=sigma,
            bandwidth=bandwidth,
            size=size,
            perceptual=perceptual,
            steps=steps,
            fitted=fitted,
            values=values,
            teacher=dpsgd is not None,
            labelled=labelled,
            n_released=len(images),
        ),
        generator=generator,
        internal={"timings_s": {"query_and_generator": round(trained, 2)}},
    )


def _label_rows(data: ImageDataset, values: list) -> np.ndarray:
    """Each record's label as its row among the registered labels; a label outside them is a data
    error."""
    lookup = {v: i for i, v in enumerate(values)}
    try:
        return np.array([lookup[int(v)] for v in data.labels], dtype=np.int64)
    except KeyError as exc:
        raise DataFormatError(
            f"{data.source}: label {exc.args[0]} is not one of the registered labels {values}."
        ) from None


def _parameters(
    config: MerfConfig,
    *,
    sigma: float,
    bandwidth: float,
    size: int,
    perceptual: float,
    steps: int,
    fitted: FittedMerf,
    values: list,
    teacher: bool,
    labelled: dict[str, Any],
    n_released: int,
) -> dict[str, Any]:
    """The release's parameters: the config, and what the plan and the run decided."""
    return {
        "mechanism": "merf",
        **config.as_dict(),
        "sigma": sigma,
        "sensitivity": SENSITIVITY,
        "bandwidth": bandwidth,
        "generator_size": size,
        # as the plan decided ("auto": MerfConfig.perceptual_for)
        "perceptual_share": perceptual,
        **(
            {"perceptual_share_setting": PERCEPTUAL_AUTO}
            if config.perceptual_share == PERCEPTUAL_AUTO
            else {}
        ),
        # as the plan decided ("auto": MerfConfig.steps_for)
        "steps": steps,
        **({"steps_setting": STEPS_AUTO} if config.steps == STEPS_AUTO else {}),
        # generators trained: more than 1 where a class collapsed (post-processing of the query)
        "generator_attempts": fitted.attempts,
        # classes every attempt left collapsed (none in a healthy release): the card says so
        "collapsed_classes": [values[c] for c in fitted.collapsed],
        # as the plan decided ("auto": from public quantities, MerfConfig.wants_teacher)
        "teacher_labels": teacher,
        **(
            {"teacher_labels_setting": TEACHER_AUTO}
            if config.teacher_labels == TEACHER_AUTO
            else {}
        ),
        **labelled,
        "n_released": n_released,
    }


def label_order(labels: np.ndarray, drawn_rows: np.ndarray) -> np.ndarray:
    """The release's order: by the classifier's label; within a label the images drawn as that
    class first (a grid of a class's first images shows its own drawings, not another class's
    images the classifier moved to it), each group in drawing order."""
    return np.lexsort((np.asarray(labels) != np.asarray(drawn_rows), labels))


def _train_classifier(
    sensitive: np.ndarray,
    rows: np.ndarray,
    n_classes: int,
    size: int,
    dpsgd: DpSgd,
    config: MerfConfig,
    ctx: RunContext,
) -> torch.nn.Module:
    """The DP label classifier, trained exactly as charged (every step through the runner's
    write-ahead counter; steps a crashed attempt ran are charged before it trains anew)."""
    started = step_counter.started(ctx.workdir)
    if started:  # an earlier attempt ran steps and crashed: they are charged before training anew
        ctx.charge_lost_steps(started, 0)
    return teacher.train(
        sensitive,
        rows,
        n_classes,
        size,
        dpsgd,
        seed=config.seed,
        before_step=lambda: step_counter.step_started(ctx.workdir),
        progress=lambda done, total: ctx.progress("DP-SGD label classifier", done, total),
    )


def _unrecognised(
    model: torch.nn.Module, size: int, n_classes: int, seed: int, gen: ConditionalGenerator
) -> list[int]:
    """The classes whose drawings the DP classifier does not recognise (a collapse the distance
    check can miss): post-processing of the two events."""
    drawn = np.repeat(np.arange(n_classes), CHECK_PER_CLASS)
    return teacher.unrecognised_classes(
        teacher.predict(model, draw(gen, drawn, seed + 2), size), drawn, n_classes
    )


def _label(
    model: torch.nn.Module,
    size: int,
    dpsgd: DpSgd,
    images: np.ndarray,
    drawn_rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The drawn images labelled by the DP classifier, sorted by their new label; the share of
    images whose label the classifier kept (post-processing of both events: safe to publish)."""
    labels = teacher.predict(model, images, size)
    kept = float(np.mean(labels == drawn_rows)) if len(labels) else 1.0
    order = label_order(labels, drawn_rows)
    return (
        labels[order],
        images[order],
        {
            "teacher_sample_rate": dpsgd.sample_rate,
            "teacher_steps": dpsgd.steps,
            "teacher_noise_multiplier": dpsgd.noise_multiplier,
            "teacher_label_agreement": round(kept, 4),
        },
    )


def _save_generator(
    workdir: Path, fitted: FittedMerf, config: MerfConfig, channels: int, bandwidth: float
) -> str:
    """The generator's weights and what rebuilds it (internal: for the audit's membership test)."""
    d = Path(workdir) / GENERATOR_DIR
    d.mkdir(parents=True, exist_ok=True)
    torch.save(fitted.generator.state_dict(), d / "generator.pt")
    (d / "settings.json").write_text(
        json.dumps(
            {
                "n_classes": int(fitted.generator.embed.num_embeddings),
                "size": fitted.size,
                "channels": channels,
                "z_dim": config.z_dim,
                "width": config.width,
                "n_features": config.n_features,
                "bandwidth": bandwidth,
                "seed": config.seed,
            }
        )
    )
    return str(d)


def loss_function(generator: str | None) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """A membership score for the audit: a record's squared distance, in the query's feature space,
    to the mean feature of 2,000 images the generator draws of its class. The generator saw the
    data only through the noisy embedding, so members should score no lower than non-members."""
    if not generator:
        return None
    d = Path(generator)
    s = json.loads((d / "settings.json").read_text())
    gen = ConditionalGenerator(s["n_classes"], s["size"], s["channels"], s["z_dim"], s["width"])
    gen.load_state_dict(torch.load(d / "generator.pt", map_location="cpu", weights_only=True))
    from synth.tools.kernel.embedding import frequencies

    w = frequencies(s["channels"] * s["size"] ** 2, s["n_features"], s["bandwidth"], s["seed"])
    fitted = FittedMerf(gen, w, None, s["size"])  # type: ignore[arg-type]
    per_class = max(1, math.ceil(2000 / s["n_classes"]))
    means = []
    for c in range(s["n_classes"]):
        drawn = fitted.draw(np.full(per_class, c), seed=c, out_size=(s["size"], s["size"]))
        means.append(features(to_unit(drawn, s["size"]).flatten(1), w).mean(0))
    centre = torch.stack(means)

    def loss(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        phi = features(to_unit(images, s["size"]).flatten(1), w)
        pos = torch.from_numpy(np.asarray(labels, dtype=np.int64)).clamp(0, s["n_classes"] - 1)
        return ((phi - centre[pos]) ** 2).sum(1).double().numpy()

    return loss


MECHANISM = registry.MechanismEntry(
    name="merf",
    config_type=MerfConfig,
    # no public data set (default_public None): the query reads the sensitive images only
    make_config=make_config,
    plan=plan,
    run=run,
    loss_function=loss_function,
    describe=describe,
    per_item=chunk_sums,
)
