"""Plan and run a k-anonymous release against the ledger (DESIGN.md rules 1, 2 and 5).

Order of a run: acknowledgement check -> reserve NonPrivateRelease -> codec on PUBLIC data (a
failure here is refunded) -> read the sensitive data -> cluster + average -> save -> commit. A
failure after the sensitive data was read still commits the event: a non-DP computation saw the data.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accounting import ledger, trail
from accounting.errors import DataFormatError, InvalidParameterError, LedgerStateError
from accounting.events import MechanismEvent, NonPrivateRelease
from accounting.store import Store
from synth.datasets import ImageDataset
from synth.ksalsa.codec import LatentCodec, conform, describe_codec, train_codec
from synth.ksalsa.config import KSalsaConfig
from synth.ksalsa.pipeline import anonymise, check_codec
from synth.ksalsa.style import StyleContentNet
from synth.progress import ProgressFn, no_progress
from synth.result import SynthResult

RULE5_WARNING = (
    "A k-anonymous release carries NO differential-privacy guarantee (DESIGN.md rule 5): after it, the "
    "dataset's DP guarantees no longer hold, for this release and for every earlier or later DP release of "
    "it (its epsilon becomes infinite in the ledger). k-anonymity only says each released image averages at "
    "least k records; it does not bound what can be inferred about one record. Acknowledge explicitly to run."
)


@dataclass
class KSalsaPlan:
    config: KSalsaConfig
    record_count: int
    events: list[MechanismEvent]
    n_released: int
    n_dropped: int
    guarantee: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"mechanism": "ksalsa", "config": self.config.public_parameters(), "record_count": self.record_count,
                "events": [e.describe() for e in self.events], "n_released": self.n_released,
                "n_dropped": self.n_dropped, "guarantee": self.guarantee, "warnings": list(self.warnings)}


def plan_ksalsa(config: KSalsaConfig, record_count: int) -> KSalsaPlan:
    """What a run will do and cost: one NonPrivateRelease event, n // k images, n mod k records dropped."""
    if not isinstance(config, KSalsaConfig):
        raise InvalidParameterError(f"config must be a KSalsaConfig, got {type(config).__name__}.")
    if isinstance(record_count, bool) or not isinstance(record_count, (int, np.integer)) or record_count < 1:
        raise InvalidParameterError(f"record_count must be a positive integer, got {record_count!r}.")
    k, n = config.k, int(record_count)
    if k > n:
        raise InvalidParameterError(f"k={k} is larger than the dataset ({n} records); choose k <= {n}.")
    warnings = [RULE5_WARNING]
    if n % k:
        warnings.append(f"{n % k} record(s) (n mod k) fall in no cluster of {k} and are dropped: not released.")
    return KSalsaPlan(config, n, [NonPrivateRelease(f"k-anonymous release, k={k}")], n // k, n % k,
                      {"type": "k-anonymity", "k": k, "method": config.method,
                       "description": f"k-anonymous (k={k})"}, warnings)


def _result_path(workdir: Path, run_id: str) -> Path:
    return Path(workdir) / f"ksalsa-result-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}.npz"


def _image_geometry(sensitive: ImageDataset, config: KSalsaConfig) -> tuple[int, int]:
    h, w = sensitive.images.shape[1:3]
    channels = 1 if sensitive.images.ndim == 3 else int(sensitive.images.shape[-1])
    if channels not in (1, 3):
        raise DataFormatError(f"{sensitive.source}: images need 1 or 3 channels, got {channels}.")
    size = config.image_size
    if size is None:
        if h != w or h % 4:
            raise InvalidParameterError(
                f"Sensitive images are {h}x{w}; the codec needs square sizes divisible by 4. Set image_size "
                "(e.g. 28 or 32) to resize them."
            )
        size = h
    return size, channels


def _save(path: Path, result: SynthResult, dataset_id: str) -> None:
    meta = {"dataset_id": dataset_id, "guarantee": result.guarantee, "parameters": result.parameters}
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, images=result.images, labels=result.labels, dist=result.label_distributions,
                        clusters=np.array(result.internal["clusters"], dtype=np.int64).reshape(len(result.labels), -1),
                        remainder=np.array(result.internal["remainder"], dtype=np.int64),
                        meta=np.array(json.dumps(meta)))
    tmp.replace(path)


def _load(path: Path, dataset_id: str, config: KSalsaConfig, events: list[MechanismEvent]) -> SynthResult | None:
    try:
        with np.load(path, allow_pickle=False) as d:
            meta = json.loads(str(d["meta"]))
            if meta["dataset_id"] != dataset_id or meta["parameters"].get("config") != config.public_parameters():
                return None
            return SynthResult(
                images=d["images"], labels=d["labels"], mechanism="ksalsa", guarantee=meta["guarantee"],
                executed_events=list(events), parameters=meta["parameters"],
                internal={"clusters": d["clusters"].tolist(), "remainder": d["remainder"].tolist()},
                label_distributions=d["dist"], artifacts={"result": str(path)},
            )
    except (OSError, ValueError, KeyError):
        return None


def run_ksalsa(store: Store, dataset: str, sensitive: ImageDataset, public: ImageDataset, config: KSalsaConfig, *,
               run_id: str, workdir: Path, progress: ProgressFn = no_progress, actor: str = "system",
               acknowledge_non_dp: bool = False, codec: LatentCodec | None = None,
               net: StyleContentNet | None = None) -> SynthResult:
    """Release one representative per cluster of k sensitive records (see module docstring)."""
    plan = plan_ksalsa(config, len(sensitive))
    if not acknowledge_non_dp:
        raise LedgerStateError(
            f"Refusing to run k-SALSA on {dataset!r} without acknowledgement. {RULE5_WARNING} "
            "Pass acknowledge_non_dp=True (CLI: the acknowledgement flag) once the steward accepts this."
        )
    if not run_id:
        raise InvalidParameterError("run_id must be a non-empty string.")
    size, channels = _image_geometry(sensitive, config)
    if int(sensitive.labels.min()) < 0:
        raise DataFormatError(f"{sensitive.source}: labels must be non-negative class indices.")
    n_classes = max(len(sensitive.class_names), int(sensitive.labels.max()) + 1)
    ds = ledger.get_dataset(store, dataset)
    if ds.record_count != len(sensitive):
        raise DataFormatError(
            f"Dataset {dataset!r} is registered with {ds.record_count} records but {len(sensitive)} images were "
            "given; pass the registered data."
        )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = _result_path(workdir, run_id)
    charge = ledger.get_charge(store, run_id)
    if charge is not None and charge.state == "committed" and path.exists():
        cached = _load(path, ds.dataset_id, config, plan.events)
        if cached is not None:
            return cached  # replay: results present, no recomputation, no second charge

    fresh = charge is None
    charge = ledger.reserve(store, dataset, plan.events, run_id, actor=actor, allow_non_private=True,
                            description=f"k-SALSA ({config.method}) k-anonymous release, k={config.k}")
    device = config.resolved_device()
    try:  # public data only up to here: a failure is refunded
        if codec is None:
            codec = train_codec(public, workdir, config, progress, size=size, channels=channels)
        check_codec(codec, torch.from_numpy(conform(public.subset(np.arange(min(4, len(public)))), size, channels)),
                    device)
        if config.method == "ksalsa" and net is None:
            from synth.ksalsa.style import EfficientNetStyleContent

            net = EfficientNetStyleContent(device, config.feature_size, config.style_layers)
    except BaseException as exc:
        # refund only a reservation made by this call: an earlier attempt under this run id may have
        # read the data before it crashed, and then its charge must stay
        if fresh and charge.state == "reserved":
            ledger.refund(store, run_id, reason=f"failed before reading sensitive data: {exc}", actor=actor)
        raise

    try:  # the sensitive data is read from here on: whatever happens, the event stays charged
        x = torch.from_numpy(conform(sensitive, size, channels))
        out = anonymise(x, sensitive.labels, n_classes, codec, config, net=net, progress=progress)
        params = {
            "k": config.k, "method": config.method, "lambda_content": config.lambda_content, "steps": config.steps,
            "image_size": size, "channels": channels, "codec": describe_codec(codec),
            "style_content_net": getattr(net, "name", type(net).__name__) if net is not None else None,
            "n_released": len(out.labels), "n_dropped": int(len(out.clusters.remainder)),
            "remainder_rule": "n mod k records in no cluster are dropped (not released)",
            "public_source": public.source, "config": config.public_parameters(),
            "seconds_averaging": round(out.seconds_averaging, 3),
        }
        result = SynthResult(
            images=out.images, labels=out.labels, mechanism="ksalsa", guarantee=dict(plan.guarantee),
            executed_events=list(plan.events), parameters=params,
            internal={"clusters": [c.tolist() for c in out.clusters.clusters],
                      "remainder": out.clusters.remainder.tolist()},
            label_distributions=out.label_distributions, artifacts={"result": str(path)},
        )
        _save(path, result, ds.dataset_id)
    except BaseException:
        ledger.commit(store, run_id, plan.events, actor=actor)
        raise
    ledger.commit(store, run_id, plan.events, actor=actor)
    with store.transaction() as con:
        trail.append(con, store, actor, "ksalsa.release", {
            "run_id": run_id, "dataset_id": ds.dataset_id, "guarantee": result.guarantee,
            "n_released": params["n_released"], "n_dropped": params["n_dropped"], "method": config.method,
        })
    return result
