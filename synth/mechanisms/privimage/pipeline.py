"""PrivImage as a registered mechanism: public preparation -> DP semantic query -> selection ->
pre-training -> DP-SGD fine-tuning -> DDIM sampling. It never touches the ledger: the runner in
release/runner.py reserves the plan's events, and settles them from what the run context recorded
(the first read of sensitive data, the write-ahead DP-SGD step counter, steps lost in a crash).

A resumed run reuses the noisy histogram (a DP output, never re-queried) and the checkpoints in
its workdir; DP-SGD steps executed but lost since the last checkpoint are charged again through
`ctx.charge_lost_steps` before they are re-executed."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accounting.errors import InvalidParameterError, LedgerStateError
from accounting.events import GaussianQuery, MechanismEvent
from synth import registry
from synth.kinds.datasets import ImageDataset
from synth.mechanisms.privimage import central, frequency, state
from synth.mechanisms.privimage.choices import plan_choices
from synth.mechanisms.privimage.config import CENTRAL_AUTO, FREQUENCY_AUTO, PrivImageConfig
from synth.mechanisms.privimage.data import (
    channels_of,
    label_index,
    pick_device,
    to_format,
    to_tensor,
)
from synth.mechanisms.privimage.describe import describe
from synth.mechanisms.privimage.model import make_unet, save_model
from synth.mechanisms.privimage.plan import PrivImagePlan, plan_privimage
from synth.mechanisms.privimage.precision import resolve_precision
from synth.mechanisms.privimage.procedural import procedural_images
from synth.mechanisms.privimage.query import (
    Selection,
    build_selection,
    noisy_semantic_histogram,
    select_fitting,
    top_k_predictions,
    train_classifier,
)
from synth.mechanisms.privimage.sampling import balanced_labels, sample_images, vary_images
from synth.mechanisms.privimage.shipped import shipped_weights
from synth.mechanisms.privimage.training import DpSgdOutcome, dp_finetune, pretrain, pretrain_cached
from synth.mechanisms.privimage.vote import VaryFn, evolve, features_for
from synth.progress import ProgressFn, no_progress
from synth.registry import DatasetInfo, MechanismOutput, MechanismPlan, RunContext
from synth.tools.kernel import bandwidth
from synth.tools.kernel.fit import MerfSettings, generator_size

MAX_SAMPLES = 1_000_000
MAX_DPSGD_STEPS = 10_000_000
MAX_QUERY_SIGMA = 1e6


@dataclass
class _Prepared:
    """What is known before any sensitive pixel is read: formats, the public classifier, the
    model."""

    device: torch.device
    label_values: list[int]
    channels: int
    public_values: list[int]
    pub_x: torch.Tensor
    pub_y: np.ndarray
    classifier: Any
    model: torch.nn.Module
    precision: str  # resolved for the device: "float32" or "bfloat16"


def make_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> PrivImageConfig:
    params = dict(params)
    if "epsilon" not in params:
        raise InvalidParameterError(
            "[privimage] needs `epsilon`, the target for the dataset's whole history."
        )
    base = {"epsilon": params.pop("epsilon"), "delta": params.pop("delta", dataset.delta_cap)}
    if n_images:
        if params.get("n_samples", n_images) != n_images:
            raise InvalidParameterError(
                f"[release] n_images = {n_images} and [privimage] n_samples = "
                f"{params['n_samples']!r} disagree; give only one of them."
            )
        params["n_samples"] = n_images
    cfg = registry.build_config(PrivImageConfig, "privimage", preset, base, params)
    if cfg.delta > dataset.delta_cap:
        raise InvalidParameterError(
            f"[privimage] delta {cfg.delta:g} exceeds the dataset's delta cap "
            f"{dataset.delta_cap:g}."
        )
    return cfg


def _check_sizes(config: PrivImageConfig, dataset: DatasetInfo, public: ImageDataset) -> None:
    """Everything that would otherwise fail only after the budget is charged."""
    if config.n_samples > MAX_SAMPLES:
        raise InvalidParameterError(
            f"[privimage] n_samples {config.n_samples:g} is "
            f"more than {MAX_SAMPLES:,}; ask for fewer images."
        )
    drawn = config.base_images * config.candidates_per_image
    if drawn > MAX_SAMPLES:
        raise InvalidParameterError(
            f"[privimage] the vote would draw {drawn:,} candidates (n_samples / "
            f"(release_variations + 1) x vote_pool), more than {MAX_SAMPLES:,}; ask for fewer "
            "images or a smaller vote_pool."
        )
    if config.query_sigma > MAX_QUERY_SIGMA:
        raise InvalidParameterError(
            f"[privimage] query_sigma {config.query_sigma:g} is above {MAX_QUERY_SIGMA:g}: "
            'the query would be pure noise. Use a value like 5-50, or selection = "all".'
        )
    n_public = len(np.unique(public.labels))  # classes present (a subset may declare more)
    if config.selection == "semantic" and config.k > n_public:
        raise InvalidParameterError(
            f"[privimage] k = {config.k:g} is more than the {n_public} classes of the public set "
            f"{public.source}; choose k <= {n_public}."
        )
    if (
        config.selection == "semantic"
        and n_public < len(dataset.labels)
        and not config.share_public_classes
    ):
        raise InvalidParameterError(
            f"The public set {public.source} has {n_public} classes but the sensitive set "
            f"{len(dataset.labels)}: the semantic query needs at least one public class per "
            "sensitive class. Use a larger public set, or share_public_classes = true."
        )
    per_epoch = math.ceil(dataset.record_count / config.batch_size)  # the plan's 1 / q
    steps = config.finetune_epochs * per_epoch
    if steps < 1:  # the plan would round up to one full step, charged, of next to no training
        raise InvalidParameterError(
            f"[privimage] finetune_epochs {config.finetune_epochs:g} means {steps:.3g} DP-SGD "
            f"steps ({per_epoch} steps make one epoch of {dataset.record_count} records at "
            f"batch_size {config.batch_size}): less than one step. Give finetune_epochs >= "
            f"{1 / per_epoch:.3g} (one step); useful values are a few epochs or more."
        )
    if steps > MAX_DPSGD_STEPS:
        raise InvalidParameterError(
            f"[privimage] finetune_epochs {config.finetune_epochs:g} means about {steps:.3g} "
            f"DP-SGD steps (limit {MAX_DPSGD_STEPS:,}); choose fewer epochs."
        )
    shape = _output_shape(config, dataset)
    if tuple(dataset.image_shape) != shape:
        raise InvalidParameterError(
            f"PrivImage releases {'x'.join(map(str, shape))} images but dataset {dataset.name!r} "
            f"is {'x'.join(map(str, dataset.image_shape))}: the audit would refuse every image. "
            "Set image_size to the dataset's size (28 or 32), or register the data at that size."
        )


def _output_shape(config: PrivImageConfig, dataset: DatasetInfo) -> tuple[int, ...]:
    colour = len(dataset.image_shape) == 3 and dataset.image_shape[-1] != 1
    return (
        (config.image_size, config.image_size, 3)
        if colour
        else (config.image_size, config.image_size)
    )


def plan(
    config: PrivImageConfig,
    dataset: DatasetInfo,
    prior: Sequence[MechanismEvent],
    public: ImageDataset,
) -> MechanismPlan:
    _check_sizes(config, dataset, public)
    try:
        p = plan_privimage(config, dataset.record_count, prior, n_classes=len(dataset.labels))
    except OverflowError as exc:
        raise InvalidParameterError(
            f"[privimage] the parameters overflow the accountant ({exc}): an epsilon, noise or "
            "step count is far outside the usual range. Use values like those of `privrelease "
            "synth privimage --write-spec FILE`."
        ) from exc
    warnings = []
    if p.noise_multiplier < 0.5:
        warnings.append(
            f"DP-SGD noise multiplier {p.noise_multiplier:.3g} is small: utility will be good but "
            "the guarantee rests on a generous epsilon."
        )
    n_public = len(np.unique(public.labels))
    one_to_one = config.selection == "semantic" and not config.share_public_classes
    if one_to_one and config.k * len(dataset.labels) >= n_public:
        warnings.append(
            f"k = {config.k} public classes for each of {len(dataset.labels)} sensitive classes "
            f"uses the whole {n_public}-class public set: the selection chooses nothing."
        )
    return MechanismPlan(
        events=tuple(p.events),
        expected_count=config.n_samples,
        output_shape=_output_shape(config, dataset),
        guarantee_kind="dp",
        warnings=tuple(warnings),
        parameters=config.as_dict(),
        detail={**p.to_json(), "choices": plan_choices(config, p, len(dataset.labels))},
    )


def _prepare_public(
    sensitive: ImageDataset, public: ImageDataset, config: PrivImageConfig, ctx: RunContext
) -> _Prepared:
    """Public data only: label sets and channel count of the sensitive set are registered
    metadata."""
    device = pick_device(config.device)
    precision = resolve_precision(config.precision, device)
    label_values, channels, public_values = (
        sensitive.label_set,
        channels_of(sensitive),
        public.label_set,
    )
    pub_x = to_tensor(to_format(public.images, config.image_size, channels))
    pub_y = label_index(public.labels, public_values)
    classifier = None
    if config.selection == "semantic" and not (ctx.workdir / state.QUERY).exists():
        torch.manual_seed(config.seed)
        classifier = train_classifier(
            pub_x,
            pub_y,
            len(public_values),
            epochs=config.classifier_epochs,
            batch=config.classifier_batch,
            seed=config.seed,
            device=device,
            progress=ctx.progress,
            augmented=True,
        )
    torch.manual_seed(config.seed)
    model = make_unet(
        config.image_size,
        channels,
        len(label_values),
        config.unet_channels,
        config.layers_per_block,
    )
    if (
        config.selection == "all"
    ):  # PDP-Diffusion-style: unconditional ("null" class) pre-training on everything
        null = torch.full((len(pub_x),), len(label_values), dtype=torch.long)
        model, _ = _pretrain(model, pub_x, null, config, device, ctx)
    if (
        config.selection == "procedural"
    ):  # a domain-agnostic prior: unconditional pre-training on generated images
        proc_x = _procedural(config, channels)
        model, _ = _pretrain(
            model,
            proc_x,
            torch.full((len(proc_x),), len(label_values), dtype=torch.long),
            config,
            device,
            ctx,
        )
    return _Prepared(
        device, label_values, channels, public_values, pub_x, pub_y, classifier, model, precision
    )


def _procedural(config: PrivImageConfig, channels: int) -> torch.Tensor:
    """The procedural public images (synth.mechanisms.privimage.procedural), seeded by the
    config's seed."""
    return to_tensor(
        procedural_images(config.procedural_images, config.image_size, config.seed, channels).images
    )


def pretrain_settings(config: PrivImageConfig, device: torch.device) -> dict[str, Any]:
    """pretrain()'s keyword arguments for `config` on `device` (all but the device, the checkpoint
    and progress); build_shipped trains the shipped checkpoint with the same ones."""
    return dict(
        steps=config.pretrain_steps,
        batch=config.pretrain_batch,
        lr=config.pretrain_lr,
        train_timesteps=config.train_timesteps,
        seed=config.seed,
        augment=config.pretrain_augment,
        elastic=config.pretrain_elastic,
        label_dropout=config.label_dropout,
        precision=resolve_precision(config.precision, device),
    )


def _pretrain(
    model, x, y, config: PrivImageConfig, device, ctx: RunContext
) -> tuple[torch.nn.Module, str]:
    """Public data only: the model and where its weights came from. A shipped checkpoint trained on
    exactly this pre-training (synth.mechanisms.privimage.shipped) is used when its sha256 checks;
    else a model pre-trained on the same public images with the same settings is reused from
    ctx.cache_dir (the semantic selection is a DP output, so keying the cache on it is
    post-processing); else it is trained."""
    kw = pretrain_settings(config, device)
    found = shipped_weights(model, x, y, kw)
    if found is not None:
        model.load_state_dict(found[0])
        ctx.progress("pretraining (shipped checkpoint, sha256 checked)", 1, 1)
        return model.to(device).eval(), found[1]
    source = f"{config.pretrain_steps} steps on the selected public images"
    if _nproc(ctx) > 1:  # plain DDP under torchrun
        from synth.mechanisms.privimage import distributed

        return distributed.pretrain(
            model,
            x,
            y,
            kw,
            nproc=_nproc(ctx),
            device=device,
            cache_dir=ctx.cache_dir,
            workdir=ctx.workdir,
            progress=ctx.progress,
            pool=getattr(ctx, "node_pool", None),
        ), source
    return pretrain_cached(
        model,
        x,
        y,
        cache_dir=ctx.cache_dir,
        workdir_ckpt=ctx.workdir / state.PRETRAIN,
        device=device,
        progress=ctx.progress,
        **kw,
    ), source


def _nproc(ctx: RunContext) -> int:
    """Processes to train and sample on (`release run --nproc`); a context without it runs
    in-process."""
    return getattr(ctx, "nproc", 1)


def _semantic_selection(
    sens_x,
    sens_y,
    sensitive: ImageDataset,
    config: PrivImageConfig,
    p: PrivImagePlan,
    prep: _Prepared,
    ctx: RunContext,
) -> tuple[dict, np.ndarray]:
    """The DP query (once: a resumed run reuses its noisy histogram), then pre-training on the
    selection. Classes that no public class fits (fit_threshold) fall back to the procedural images,
    which join the pre-training set under the null class: they carry no class, so they shape the
    shared denoiser and leave the class embeddings to the fitting public classes, the central images
    and DP-SGD."""
    query = _semantic_query(sens_x, sens_y, config, p, prep, ctx)
    selection = build_selection(query["chosen"], prep.pub_y)
    public = registry.images_only(ctx.public, "PrivImage's public data")
    named, fallback, fitted = _selection_names(selection, prep, sensitive, public)
    x, y = prep.pub_x[selection.public_index], torch.from_numpy(selection.new_labels)
    if fallback:
        proc_x = _procedural(config, prep.channels)
        x = torch.cat([x, proc_x])
        y = torch.cat([y, torch.full((len(proc_x),), len(prep.label_values), dtype=torch.long)])
    prep.model, pretrained = _pretrain(prep.model, x, y, config, prep.device, ctx)
    info = {
        "public_pretraining": pretrained,
        "selected_public_classes": named,
        "selection_ratio": selection.ratio,
        "selected_images": int(len(selection.public_index)),
        "noisy_histogram": query["noisy_histogram"],
        "fitted_classes": fitted,
        "fallback_classes": fallback,
    }
    return info, np.unique(np.asarray(selection.public_index, dtype=np.int64))


def _semantic_query(
    sens_x: torch.Tensor,
    sens_y: np.ndarray,
    config: PrivImageConfig,
    p: PrivImagePlan,
    prep: _Prepared,
    ctx: RunContext,
) -> dict[str, Any]:
    """The DP semantic query's noisy histogram and chosen classes, made once: a resumed run reads
    back the answer its first attempt wrote (and paid for)."""
    query = state.read_json(ctx.workdir / state.QUERY)
    if query is not None:
        return query
    if prep.classifier is None or p.query_event is None:
        raise LedgerStateError(
            f"{ctx.workdir}: the query classifier or the "
            "query's charge is missing; re-plan the release."
        )
    sigma = p.query_event.sigma
    top = top_k_predictions(prep.classifier, sens_x, config.k, prep.device)
    noisy = noisy_semantic_histogram(
        top,
        sens_y,
        len(prep.label_values),
        len(prep.public_values),
        sigma,
        np.random.default_rng(),  # OS entropy
    )
    chosen = select_fitting(
        noisy,
        config.k,
        fit_threshold=config.fit_threshold,
        noise_std=sigma,
        shared=config.share_public_classes,
    )
    query = {"noisy_histogram": noisy.tolist(), "chosen": chosen}
    state.write_json(ctx.workdir / state.QUERY, query)
    return query


def _selection_names(
    selection: Selection, prep: _Prepared, sensitive: ImageDataset, public: ImageDataset
) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """The selection by name: each sensitive class's chosen public classes, the classes that fell
    back to procedural images, and the ones a public class fits."""

    def pub_name(j: int) -> str:
        v = prep.public_values[j]
        return public.class_names[v] if v < len(public.class_names) else str(v)

    def sens_name(v: int) -> str:
        return sensitive.class_names[v] if v < len(sensitive.class_names) else str(v)

    named = {
        sens_name(v): [pub_name(j) for j in cols]
        for v, cols in zip(prep.label_values, selection.chosen, strict=True)
    }
    fallback = [
        sens_name(v)
        for v, cols in zip(prep.label_values, selection.chosen, strict=True)
        if not cols
    ]
    fitted = [sens_name(v) for v in prep.label_values if sens_name(v) not in fallback]
    return named, fallback, fitted


def _central_warmup(
    sens_x: torch.Tensor,
    sens_y: np.ndarray,
    config: PrivImageConfig,
    event: GaussianQuery,
    prep: _Prepared,
    ctx: RunContext,
) -> dict[str, Any]:
    """DP central images (charged as the plan's central `event`; computed once, a resumed run
    reuses them), then pre-training on augmented copies of them labelled with their class, after any
    public pre-training."""
    saved = central.load(ctx.workdir)
    if saved is None:
        saved = central.central_images(
            sens_x,
            sens_y,
            len(prep.label_values),
            queries=event.count,
            clip=config.central_clip,
            noise_multiplier=config.central_sigma,
            seed=config.seed,
            augment=config.pretrain_augment,
        )
        central.save(ctx.workdir, *saved)
    images, labels = saved
    _warm_up_on(
        torch.from_numpy(images),
        torch.from_numpy(labels),
        config,
        prep,
        ctx,
        steps=config.central_steps,
        seed=config.seed + 1,
        ckpt="central_pretrain.pt",
        augment=max(config.pretrain_augment, 1.0),
    )
    return {"central_images_per_class": event.count}


def _warm_up_on(
    x: torch.Tensor,
    y: torch.Tensor,
    config: PrivImageConfig,
    prep: _Prepared,
    ctx: RunContext,
    *,
    steps: int,
    seed: int,
    ckpt: str,
    augment: float,
) -> None:
    """Pre-train the model further on a warm-up stage's images (central or frequency), with the
    recipe's pre-training settings and a checkpoint of its own in the run's folder."""
    prep.model = pretrain(
        prep.model,
        x.float(),
        y.long(),
        steps=steps,
        batch=config.pretrain_batch,
        lr=config.pretrain_lr,
        train_timesteps=config.train_timesteps,
        seed=seed,
        device=prep.device,
        ckpt=ctx.workdir / ckpt,
        progress=ctx.progress,
        augment=augment,
        label_dropout=config.label_dropout,
        precision=prep.precision,
    )


def _frequency_warmup(
    sens_formatted: np.ndarray,
    sens_y: np.ndarray,
    config: PrivImageConfig,
    event: GaussianQuery,
    prep: _Prepared,
    ctx: RunContext,
) -> dict[str, Any]:
    """FETA-Pro's frequency warm-up (synth.mechanisms.privimage.frequency; charged as the plan's
    frequency
    `event`), then pre-training on the generator's images labelled with their class."""
    channels = prep.channels
    n_pixels = channels * generator_size(*sens_formatted.shape[1:3]) ** 2
    settings = MerfSettings(
        n_features=config.frequency_features,
        # the merf mechanism's rule for this query's noise (FETA-Pro's sigma: the wide kernel)
        bandwidth=bandwidth.auto_bandwidth(
            n_pixels,
            bandwidth.relative_noise(
                event.sigma, config.frequency_features, len(sens_y), len(prep.label_values)
            ),
        ),
        z_dim=bandwidth.Z_DIM,
        width=bandwidth.WIDTH,
        steps=config.frequency_generator_steps,
        batch=bandwidth.BATCH,
        lr=bandwidth.LR,
        seed=config.seed,
    )
    x, y = frequency.warmup_images(
        sens_formatted,
        sens_y,
        len(prep.label_values),
        event,
        settings,
        config.frequency_images,
        ctx.workdir,
        ctx.progress,
    )
    _warm_up_on(
        x,
        y,
        config,
        prep,
        ctx,
        steps=config.frequency_steps,
        seed=config.seed + 2,
        ckpt="frequency_pretrain.pt",
        augment=config.pretrain_augment,
    )
    return {"frequency_images": len(x)}


def run(config: PrivImageConfig, data: ImageDataset, ctx: RunContext) -> MechanismOutput:
    p = _checked_plan(ctx, len(data))
    t0 = time.time()
    _check_processes(ctx, config)
    prep = _prepare_public(
        data, registry.images_only(ctx.public, "PrivImage's public data"), config, ctx
    )
    ctx.on_sensitive_access()  # from here on, failures stay charged
    # uint8; the vote reads it too
    sens_formatted = to_format(data.images, config.image_size, prep.channels)
    sens_x = to_tensor(sens_formatted)
    sens_y = label_index(data.labels, prep.label_values)
    info, selected = _warm_ups(sens_formatted, sens_x, sens_y, data, config, p, prep, ctx)
    t_pre = time.time()
    outcome, images = _finetune(sens_x, torch.from_numpy(sens_y), config, p, prep, ctx)
    del sens_x
    t_dp = time.time()
    images, positions, model, model_dir = _sample(outcome.weights, data, config, prep, ctx, images)
    t_sample = time.time()
    vote_info: dict[str, Any] = {}
    noisy_votes = None
    if p.vote_event is not None:
        images, positions, vote_info, noisy_votes = _vote(
            images, positions, sens_formatted, sens_y, model, config, p, prep, ctx
        )
    t_vote = time.time()
    images, positions = _with_variations(images, positions, model, config, prep, ctx)
    images, positions = _release_order(images, positions, config, p)
    labels = np.asarray(prep.label_values, dtype=np.int64)[positions]
    timings = {
        "classifier_and_pretraining": round(t_pre - t0, 2),
        "dp_finetuning": round(t_dp - t_pre, 2),
        "sampling": round(t_sample - t_dp, 2),
        "vote": round(t_vote - t_sample, 2),
        "release_variations": round(time.time() - t_vote, 2),
    }
    info.update(vote_info)
    internal = _internal(info, noisy_votes, outcome, config, timings)
    return MechanismOutput(
        images=images,
        labels=labels,
        parameters=_parameters(config, p, prep, info),
        selected_public_indices=selected,
        internal=internal,
        generator=str(model_dir),
        artifacts=_artifacts(ctx.workdir, model_dir),
    )


def _checked_plan(ctx: RunContext, n_records: int) -> PrivImagePlan:
    """The approved plan, refused if it was made for another number of records."""
    p = PrivImagePlan.from_json(dict(ctx.plan.detail))
    if p.record_count != n_records:
        raise InvalidParameterError(
            f"The plan was made for {p.record_count} records but the sensitive set has "
            f"{n_records}; re-plan."
        )
    return p


def _check_processes(ctx: RunContext, config: PrivImageConfig) -> None:
    """Under torchrun, refuse a process count this host cannot hold, before anything is read."""
    if _nproc(ctx) != 1:  # refused before anything is read or trained (refunded)
        from synth.mechanisms.privimage.distributed import check_nproc

        # across hosts (`--nnodes`), what must fit on this host is --nproc-per-node
        check_nproc(getattr(ctx, "nproc_per_node", _nproc(ctx)), pick_device(config.device))


def _warm_ups(
    sens_formatted: np.ndarray,
    sens_x: torch.Tensor,
    sens_y: np.ndarray,
    data: ImageDataset,
    config: PrivImageConfig,
    p: PrivImagePlan,
    prep: _Prepared,
    ctx: RunContext,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Before DP fine-tuning, in order: the semantic selection and its pre-training, the frequency
    warm-up, the central warm-up (each where planned); their info and the selected public images."""
    info: dict[str, Any] = {}
    selected = None
    if config.selection == "semantic":
        info, selected = _semantic_selection(sens_x, sens_y, data, config, p, prep, ctx)
    if p.frequency_event is not None:
        info.update(_frequency_warmup(sens_formatted, sens_y, config, p.frequency_event, prep, ctx))
    if p.central_event is not None:
        info.update(_central_warmup(sens_x, sens_y, config, p.central_event, prep, ctx))
    return info, selected


def _release_order(
    images: np.ndarray, positions: np.ndarray, config: PrivImageConfig, p: PrivImagePlan
) -> tuple[np.ndarray, np.ndarray]:
    """The release's order: seeded random where the vote or variations ranked or grouped the
    images."""
    if p.vote_event is not None or config.release_variations:
        # the winners come ranked by their noisy counts, the variations beside their image: release
        # them in a seeded random order, so that the bundle's first rows (and its sample grid) are a
        # fair sample
        order = np.random.default_rng(config.seed).permutation(len(images))
        images, positions = images[order], positions[order]
    return images, positions


def _internal(
    info: dict[str, Any],
    noisy_votes: Any,
    outcome: DpSgdOutcome,
    config: PrivImageConfig,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The run's internal record (takes the noisy histogram out of `info`)."""
    return {
        "noisy_histogram": info.pop("noisy_histogram", None),
        "noisy_votes": noisy_votes,
        "opacus_history": [list(h) for h in outcome.opacus_history],
        "opacus_epsilon_dpsgd": _opacus_epsilon(outcome.opacus_history, config.delta),
        "timings_s": timings,
    }


def _finetune(
    sens_x: torch.Tensor,
    sens_y: torch.Tensor,
    config: PrivImageConfig,
    p: PrivImagePlan,
    prep: _Prepared,
    ctx: RunContext,
) -> tuple[DpSgdOutcome, np.ndarray | None]:
    """DP-SGD in this process, or DP-SGD and sampling on ctx.nproc processes (images then come back
    too)."""
    kw: dict[str, Any] = dict(
        sample_rate=p.sample_rate,
        noise_multiplier=p.noise_multiplier,
        steps=p.steps,
        batch_size=config.batch_size,
        max_physical_batch=config.max_physical_batch,
        max_grad_norm=config.max_grad_norm,
        t_min=config.finetune_t_min,
        lr=config.lr,
        ema_decay=config.ema_decay,
        train_timesteps=config.train_timesteps,
        seed=config.seed,
        ckpt_every=config.checkpoint_every,
        optimizer=config.dp_optimizer,
        noise_multiplicity=config.noise_multiplicity,
        trainable=config.trainable,
        secure_noise=config.secure_noise,
        precision=prep.precision,
    )
    if _nproc(ctx) == 1:
        return dp_finetune(
            prep.model,
            sens_x,
            sens_y,
            device=prep.device,
            workdir=ctx.workdir,
            on_resume=ctx.charge_lost_steps,
            progress=ctx.progress,
            **kw,
        ), None
    from synth.mechanisms.privimage import distributed

    return distributed.finetune_and_sample(
        prep.model,
        sens_x,
        sens_y,
        kw,
        _sample_kwargs(config, prep),
        _unet_args(config, prep),
        nproc=_nproc(ctx),
        device=prep.device,
        ctx=ctx,
    )


def _unet_args(config: PrivImageConfig, prep: _Prepared) -> tuple:
    return (
        config.image_size,
        prep.channels,
        len(prep.label_values),
        config.unet_channels,
        config.layers_per_block,
    )


def _sample_kwargs(config: PrivImageConfig, prep: _Prepared) -> dict[str, Any]:
    """Sampling settings; with the vote on, `vote_pool` candidates are drawn per image to
    release."""
    n = config.base_images * config.candidates_per_image
    return dict(
        labels=balanced_labels(n, len(prep.label_values)),
        image_size=config.image_size,
        channels=prep.channels,
        seed=config.seed,
        **_denoising(config, prep.device),
    )


def _denoising(config: PrivImageConfig, device: torch.device) -> dict[str, Any]:
    """The sampler's settings, shared by sampling and every variation pass."""
    return dict(
        train_timesteps=config.train_timesteps,
        ddim_steps=config.ddim_steps,
        sampler=config.sampler,
        batch=config.sample_batch,
        guidance=config.guidance,
        precision=resolve_precision(config.precision, device),
    )


def _sample(
    weights: dict,
    data: ImageDataset,
    config: PrivImageConfig,
    prep: _Prepared,
    ctx: RunContext,
    images: np.ndarray | None = None,
):
    """Save the generator; sample the released images unless the distributed workers already did."""
    model = make_unet(*_unet_args(config, prep))
    model.load_state_dict(weights)
    model_dir = save_model(
        model,
        ctx.workdir / state.MODEL_DIR,
        label_values=prep.label_values,
        class_names=list(data.class_names),
        image_size=config.image_size,
        channels=prep.channels,
        train_timesteps=config.train_timesteps,
    )
    kw = _sample_kwargs(config, prep)
    positions = kw.pop("labels")
    if images is None:
        images = sample_images(model, positions, device=prep.device, progress=ctx.progress, **kw)
    return images, positions, model, model_dir


def _vote(
    candidates: np.ndarray,
    candidate_pos: np.ndarray,
    sens_images: np.ndarray,
    sens_pos: np.ndarray,
    model: torch.nn.Module,
    config: PrivImageConfig,
    p: PrivImagePlan,
    prep: _Prepared,
    ctx: RunContext,
) -> tuple[np.ndarray, np.ndarray, dict, list]:
    """The private vote, as many rounds as the planned vote event's count (Private Evolution,
    vote.py). Each round's selection is saved before the next starts: a resumed run re-draws the
    same seeded candidates and variations and reuses the saved selections, so no round's noise is
    drawn (or charged) twice."""
    path = ctx.workdir / state.VOTE
    saved = state.read_json(path, {"rounds": []})
    if "keep" in saved:  # a one-round vote.json from before the rounds existed
        saved = {"rounds": [saved]}
    n_rounds, first_pool = len(p.vote_sigmas), len(candidates)

    def record(r: int, keep: np.ndarray, noisy: np.ndarray) -> None:
        saved["rounds"].append({"keep": keep.tolist(), "noisy_votes": noisy.round(3).tolist()})
        state.write_json(path, saved)
        ctx.progress("private vote" if n_rounds == 1 else f"private vote {r + 1}/{n_rounds}", 1, 1)

    images, positions = evolve(
        sens_images,
        sens_pos,
        candidates,
        candidate_pos,
        balanced_labels(config.base_images, len(prep.label_values)),
        p.vote_sigmas,
        variations_for(model, config, prep.device, ctx.progress),
        config.vote_pool,
        saved=[r["keep"] for r in saved["rounds"]],
        on_round=record,
        featurize=features_for(config.vote_space, prep.device, prep.precision),
        neighbours=config.vote_neighbours,
    )
    info = {"vote_candidates": int(first_pool), "vote_kept": int(len(images))}
    return images, positions, info, [r["noisy_votes"] for r in saved["rounds"][:n_rounds]]


def _with_variations(
    images: np.ndarray,
    positions: np.ndarray,
    model: torch.nn.Module,
    config: PrivImageConfig,
    prep: _Prepared,
    ctx: RunContext,
) -> tuple[np.ndarray, np.ndarray]:
    """Each image followed by `release_variations` low-strength SDEdit variations of it drawn by the
    DP model (post-processing of DP outputs: no privacy cost), cut to `n_samples`. A larger release
    of the same digits with small changes of stroke and shape: classifiers trained on it generalise
    better (BENCHMARKS.md)."""
    copies = config.release_variations
    if not copies:
        return images, positions
    varied = vary_images(
        model,
        images,
        positions,
        strength=config.release_variation_strength,
        copies=copies,
        seed=config.seed + 1000,
        device=prep.device,
        progress=ctx.progress,
        stage="release variations",
        **_denoising(config, prep.device),
    )
    images = np.concatenate(
        [images[:, None], varied.reshape(len(images), copies, *images.shape[1:])], axis=1
    )
    positions = np.repeat(positions, copies + 1)
    return images.reshape(-1, *images.shape[2:])[: config.n_samples], positions[: config.n_samples]


def variations_for(
    model: torch.nn.Module,
    config: PrivImageConfig,
    device: torch.device,
    progress: ProgressFn = no_progress,
) -> VaryFn:
    """The vote's later rounds: `vote_pool` SDEdit variations of each winner, seeded by config seed
    + round."""

    def vary(images: np.ndarray, positions: np.ndarray, r: int) -> np.ndarray:
        return vary_images(
            model,
            images,
            positions,
            strength=config.variation_strength,
            copies=config.vote_pool,
            seed=config.seed + r,
            device=device,
            progress=progress,
            stage=f"variations {r + 1}/{config.vote_rounds}",
            **_denoising(config, device),
        )

    return vary


def _parameters(
    config: PrivImageConfig, p: PrivImagePlan, prep: _Prepared, selection_info: dict
) -> dict[str, Any]:
    return {
        "mechanism": "privimage",
        "selection": config.selection,
        "k": config.k,
        "query_sigma": config.query_sigma if config.selection == "semantic" else None,
        "noise_multiplier": p.noise_multiplier,
        "sample_rate": p.sample_rate,
        "steps": p.steps,
        "expected_batch_size": p.expected_batch,
        "max_physical_batch": config.max_physical_batch,
        "max_grad_norm": config.max_grad_norm,
        "finetune_t_min": config.finetune_t_min,
        "image_size": config.image_size,
        "channels": prep.channels,
        "lr": config.lr,
        "ema_decay": config.ema_decay,
        "dp_optimizer": config.dp_optimizer,
        "noise_multiplicity": config.noise_multiplicity,
        "trainable": config.trainable,
        "guidance": config.guidance,
        "vote_sigma": config.vote_sigma or None,
        "vote_pool": config.vote_pool if config.vote_sigma else None,
        "vote_rounds": config.vote_rounds if config.vote_sigma else None,
        "vote_space": config.vote_space if config.vote_sigma else None,
        "vote_neighbours": config.vote_neighbours if config.vote_sigma else None,
        "variation_strength": config.variation_strength
        if config.vote_sigma and config.vote_rounds > 1
        else None,
        "release_variations": config.release_variations,
        "release_variation_strength": config.release_variation_strength
        if config.release_variations
        else None,
        "secure_noise": config.secure_noise,
        "precision": prep.precision,
        "pretrain_augment": config.pretrain_augment,
        "pretrain_elastic": config.pretrain_elastic,
        "label_dropout": config.label_dropout,
        "pretrain_steps": config.pretrain_steps if config.selection != "none" else 0,
        "ddim_steps": config.ddim_steps,
        "sampler": config.sampler,
        **_prior_parameters(config, p),
        "n_samples": config.n_samples,
        "unet_channels": list(config.unet_channels),
        "target_epsilon": config.epsilon,
        "delta": config.delta,
        **selection_info,
    }


def _prior_parameters(config: PrivImageConfig, p: PrivImagePlan) -> dict[str, Any]:
    """The prior's settings (docs/privimage-priors.md); the central images' noise as planned and
    charged."""
    out: dict[str, Any] = {
        "fit_threshold": config.fit_threshold,
        "share_public_classes": config.share_public_classes,
        "procedural_images": config.procedural_images,
        # the number the plan charged; "auto" decided it (docs/privimage-priors.md)
        "central_images": p.central_event.count if p.central_event is not None else 0,
    }
    if config.central_images == CENTRAL_AUTO:
        out["central_images_setting"] = CENTRAL_AUTO
    if p.central_event is not None:
        out.update(
            central_sigma=config.central_sigma,
            central_clip=config.central_clip,
            central_noise_std=p.central_event.sigma,
            central_steps=config.central_steps,
        )
    # decided by the plan ("auto" from public metadata: synth.mechanisms.privimage.frequency)
    out["frequency_warmup"] = p.frequency_event is not None
    if config.frequency_warmup == FREQUENCY_AUTO:
        out["frequency_warmup_setting"] = FREQUENCY_AUTO
    if p.frequency_event is not None:
        out.update(
            frequency_sigma=config.frequency_sigma,
            frequency_noise_std=p.frequency_event.sigma,
            frequency_features=config.frequency_features,
            frequency_generator_steps=config.frequency_generator_steps,
            frequency_images=config.frequency_images,
            frequency_steps=config.frequency_steps,
        )
    return out


def _artifacts(workdir: Path, model_dir: Path) -> dict[str, str]:
    found = {
        "pretrain_checkpoint": state.PRETRAIN,
        "finetune_checkpoint": state.FINETUNE,
        "query": state.QUERY,
        "vote": state.VOTE,
        "central_images": central.CENTRAL,
        "frequency_embedding": frequency.EMBEDDING,
    }
    return {
        "model": str(model_dir),
        **{k: str(workdir / v) for k, v in found.items() if (workdir / v).exists()},
    }


def _opacus_epsilon(history: list, delta: float) -> float | None:
    """Epsilon of the DP-SGD part as opacus' own RDP accountant reports it (same orders as ours)."""
    if not history:
        return None
    from opacus.accountants import RDPAccountant

    from accounting.epsilon import RDP_ORDERS

    acc = RDPAccountant()
    acc.history = [tuple(h) for h in history]
    return float(acc.get_epsilon(delta=delta, alphas=list(RDP_ORDERS)))


def loss_function(generator: str | None) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    if not generator:
        return None
    from synth.mechanisms.privimage.model import per_sample_diffusion_loss

    return lambda images, labels: per_sample_diffusion_loss(generator, images, labels)


MECHANISM = registry.MechanismEntry(
    name="privimage",
    config_type=PrivImageConfig,
    default_public="builtin:public-pool",  # pre-training and the semantic query's classes
    make_config=make_config,
    plan=plan,
    run=run,
    loss_function=loss_function,
    distributed=True,
    node_worker="synth.mechanisms.privimage.worker",
    dpsgd_trainer=dp_finetune,
    describe=describe,
)
