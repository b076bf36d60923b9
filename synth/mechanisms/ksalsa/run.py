"""k-SALSA as a registered mechanism (ledger-free; release/runner.py charges it).

Order of a run: codec on PUBLIC data and a shape check (a failure here is refunded by the runner) ->
`ctx.on_sensitive_access()` -> read the sensitive data -> cluster + average. A failure after the
sensitive data was read stays charged: a non-DP computation saw the data (README, "Privacy
guarantees and their limits": k-anonymity is not DP)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from accounting.errors import DataFormatError, InvalidParameterError
from accounting.events import MechanismEvent, NonPrivateRelease
from synth import registry
from synth.kinds.datasets import ImageDataset
from synth.mechanisms.ksalsa import cluster_items
from synth.mechanisms.ksalsa.codec import LatentCodec, conform, describe_codec, train_codec
from synth.mechanisms.ksalsa.config import KSalsaConfig
from synth.mechanisms.ksalsa.describe import describe
from synth.mechanisms.ksalsa.pipeline import anonymise, check_codec
from synth.mechanisms.ksalsa.style import StyleContentNet
from synth.registry import DatasetInfo, MechanismOutput, MechanismPlan, RunContext

RULE5_WARNING = (
    "A k-anonymous release carries NO differential-privacy guarantee: after it, the dataset's DP "
    "guarantees no longer hold, for this release and for every earlier or later DP release of it "
    "(its epsilon becomes infinite in the ledger). k-anonymity only says each released image "
    "averages at least k records; it does not bound what can be inferred about one record. "
    "Acknowledge explicitly to run."
)


@dataclass(frozen=True)
class KSalsaPlan:
    config: KSalsaConfig
    record_count: int
    events: tuple[MechanismEvent, ...]
    n_released: int
    n_dropped: int
    warnings: tuple[str, ...]


def plan_ksalsa(config: KSalsaConfig, record_count: int) -> KSalsaPlan:
    """What a run will do and cost: one NonPrivateRelease event, n // k images, n mod k records
    dropped."""
    if not isinstance(config, KSalsaConfig):
        raise InvalidParameterError(f"config must be a KSalsaConfig, got {type(config).__name__}.")
    if (
        isinstance(record_count, bool)
        or not isinstance(record_count, (int, np.integer))
        or record_count < 1
    ):
        raise InvalidParameterError(
            f"record_count must be a positive integer, got {record_count!r}."
        )
    k, n = config.k, int(record_count)
    if k > n:
        raise InvalidParameterError(
            f"k={k:g} is larger than the dataset ({n} records); choose k <= {n}."
        )
    warnings = [RULE5_WARNING]
    if n % k:
        warnings.append(
            f"{n % k} record(s) (n mod k) fall in no cluster of {k} and are dropped: not released."
        )
    return KSalsaPlan(
        config,
        n,
        (NonPrivateRelease(f"k-anonymous release, k={k}"),),
        n // k,
        n % k,
        tuple(warnings),
    )


def make_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> KSalsaConfig:
    params = dict(params)
    if "k" not in params:
        raise InvalidParameterError(
            "[ksalsa] needs `k`, the anonymity parameter (every image averages k records)."
        )
    base = {"k": params.pop("k")}
    if "method" in params:
        base["method"] = params.pop("method")
    return registry.build_config(KSalsaConfig, "ksalsa", preset, base, params)


def _geometry(shape: Sequence[int], config: KSalsaConfig) -> tuple[int, int]:
    h, w = shape[:2]
    channels = 1 if len(shape) == 2 else int(shape[-1])
    if channels not in (1, 3):
        raise DataFormatError(f"k-SALSA needs images with 1 or 3 channels, got {channels}.")
    size = config.image_size
    if size is None:
        if h != w or h % 4:
            raise InvalidParameterError(
                f"Sensitive images are {h}x{w}; the codec needs square sizes divisible by 4. Set "
                "image_size (e.g. 28 or 32) to resize them."
            )
        size = h
    return size, channels


def plan(
    config: KSalsaConfig,
    dataset: DatasetInfo,
    prior: Sequence[MechanismEvent],
    public: ImageDataset,
) -> MechanismPlan:
    p = plan_ksalsa(config, dataset.record_count)
    size, channels = _geometry(dataset.image_shape, config)
    shape = (size, size) if channels == 1 else (size, size, channels)
    if tuple(dataset.image_shape) != shape:
        raise InvalidParameterError(
            f"k-SALSA would release {'x'.join(map(str, shape))} images but dataset "
            f"{dataset.name!r} is {'x'.join(map(str, dataset.image_shape))}: the audit would "
            "refuse every image. Leave image_size unset."
        )
    return MechanismPlan(
        events=p.events,
        expected_count=p.n_released,
        output_shape=shape,
        guarantee_kind="k-anonymity",
        warnings=p.warnings,
        requires_acknowledgement=True,
        parameters=config.as_dict(),
        detail={
            "n_released": p.n_released,
            "n_dropped": p.n_dropped,
            "guarantee_description": f"k-anonymous (k={config.k})",
        },
    )


def run(
    config: KSalsaConfig,
    data: ImageDataset,
    ctx: RunContext,
    *,
    codec: LatentCodec | None = None,
    net: StyleContentNet | None = None,
) -> MechanismOutput:
    """One representative per cluster of k sensitive records; `codec`/`net` replace the trained
    ones."""
    size, channels = _geometry(data.image_shape, config)
    public = registry.images_only(ctx.public, "k-SALSA's public data")
    if codec is None:  # public data only up to on_sensitive_access: a failure is refunded
        codec = train_codec(public, ctx.workdir, config, ctx.progress, size=size, channels=channels)
    probe = torch.from_numpy(conform(public.subset(np.arange(min(4, len(public)))), size, channels))
    check_codec(codec, probe, config.resolved_device())
    with cluster_items.own_net(config, net):
        return _run(config, data, ctx, codec, public)


def _run(
    config: KSalsaConfig,
    data: ImageDataset,
    ctx: RunContext,
    codec: LatentCodec,
    public: ImageDataset,
) -> MechanismOutput:
    size, channels = _geometry(data.image_shape, config)
    net, map_batches = None, None
    if config.method == "ksalsa":
        # public weights in every process that will optimise a batch: a failure here is refunded
        ctx.prepare_workers(cluster_items.prepare, config)
        net = cluster_items.style_net(config)
        job = cluster_items.ClusterJob.of(config, codec)

        def map_batches(items: list) -> list:
            return list(
                ctx.map_items(cluster_items.average_clusters, job, items, label=cluster_items.LABEL)
            )

    ctx.on_sensitive_access()
    if int(data.labels.min()) < 0:
        raise DataFormatError(f"{data.source}: labels must be non-negative class indices.")
    n_classes = max(len(data.class_names), int(data.labels.max()) + 1)
    out = anonymise(
        torch.from_numpy(conform(data, size, channels)),
        data.labels,
        n_classes,
        codec,
        config,
        net=net,
        progress=ctx.progress,
        map_batches=map_batches,
    )
    params = {
        "k": config.k,
        "method": config.method,
        "lambda_content": config.lambda_content,
        "steps": config.steps,
        "image_size": size,
        "channels": channels,
        "codec": describe_codec(codec),
        "style_content_net": getattr(net, "name", type(net).__name__) if net is not None else None,
        "n_released": len(out.labels),
        "n_dropped": int(len(out.clusters.remainder)),
        "remainder_rule": "n mod k records in no cluster are dropped (not released)",
        "public_source": public.source,
        "config": config.as_dict(),
        "seconds_averaging": round(out.seconds_averaging, 3),
    }
    return MechanismOutput(
        images=out.images,
        labels=out.labels,
        parameters=params,
        label_distributions=out.label_distributions,
        clusters=tuple(np.asarray(c, dtype=np.int64) for c in out.clusters.clusters),
        internal={"remainder": [int(i) for i in out.clusters.remainder]},
    )


MECHANISM = registry.MechanismEntry(
    name="ksalsa",
    config_type=KSalsaConfig,
    default_public="builtin:uci-digits",  # the codec's training images
    make_config=make_config,
    plan=plan,
    run=run,
    describe=describe,
    per_item=cluster_items.average_clusters,
)
