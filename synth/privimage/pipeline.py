"""run_privimage / abandon_privimage: the PrivImage pipeline charged to the ledger.

Charging (DESIGN.md rules 1-3): reserve the planned events first; train the query classifier on
public data; a failure up to the first read of sensitive data is refunded. From then on a failure
leaves the reservation `reserved` (conservative) and checkpoints in `workdir`; calling run again
with the same run id resumes (the noisy histogram is reused, never re-queried; DP-SGD steps that
were executed but lost since the last checkpoint are charged under `{run_id}:redo-{n}`).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from accounting import ledger
from accounting.errors import InvalidParameterError, LedgerStateError, PrivReleaseError
from accounting.events import DpSgd, MechanismEvent, event_from_json, event_to_json
from accounting.store import Store
from synth.datasets import ImageDataset
from synth.privimage import state
from synth.privimage.config import PrivImageConfig
from synth.privimage.data import channels_of, label_index, pick_device, to_format, to_tensor
from synth.privimage.model import make_unet, save_model
from synth.privimage.plan import PrivImagePlan, plan_privimage
from synth.privimage.query import (build_selection, noisy_semantic_histogram, select_classes, top_k_predictions,
                                   train_classifier)
from synth.privimage.sampling import balanced_labels, sample_images
from synth.privimage.training import dp_finetune, pretrain
from synth.progress import ProgressFn, no_progress
from synth.result import SynthResult

_RESUME_IGNORED = ("device", "sample_batch")  # may change between attempts without changing the mechanism


def _ours(charge_run_id: str, run_id: str) -> bool:
    return charge_run_id == run_id or charge_run_id.startswith(f"{run_id}:redo-")


def _resolve_plan(store: Store, dataset: str, config: PrivImageConfig, record_count: int, run_id: str,
                  workdir: Path, plan: PrivImagePlan | None) -> PrivImagePlan:
    """The plan of a fresh run, or the stored one of a run being resumed (recomputing it would see
    this run's own reservation as prior spend)."""
    saved = state.read_json(workdir / state.PLAN)
    if saved is not None:
        stored_cfg = {k: v for k, v in saved["config"].items() if k not in _RESUME_IGNORED}
        if stored_cfg != {k: v for k, v in config.as_dict().items() if k not in _RESUME_IGNORED}:
            raise InvalidParameterError(
                f"{workdir} holds run {saved['run_id']!r} with a different configuration; resume with the same "
                "configuration or use a new run id and workdir."
            )
        if saved["run_id"] != run_id:
            raise InvalidParameterError(f"{workdir} belongs to run {saved['run_id']!r}, not {run_id!r}; use a new workdir.")
        stored = PrivImagePlan.from_json(saved["plan"])
        if plan is not None and plan.to_json() != stored.to_json():
            raise InvalidParameterError("The plan passed differs from the one this run was started with.")
        return stored
    if plan is not None:
        return plan
    b = ledger.budget(store, dataset)
    prior = [e for c in b.charges if not _ours(c.run_id, run_id) for e in c.counted_events]
    return plan_privimage(config, record_count, prior)


def _stored_result(workdir: Path) -> SynthResult:
    meta = state.read_json(workdir / state.RESULT)
    with np.load(workdir / state.SAMPLES) as data:
        images, labels = data["images"], data["labels"]
    return SynthResult(images=images, labels=labels, mechanism="privimage", guarantee=meta["guarantee"],
                       executed_events=[event_from_json(e) for e in meta["executed_events"]],
                       parameters=meta["parameters"], internal=meta["internal"], artifacts=meta["artifacts"])


def run_privimage(store: Store, dataset: str, sensitive: ImageDataset, public: ImageDataset, config: PrivImageConfig,
                  *, run_id: str, workdir: Path, progress: ProgressFn = no_progress, actor: str = "system",
                  plan: PrivImagePlan | None = None) -> SynthResult:
    """Run (or resume) PrivImage on `sensitive`, charged to `dataset`'s ledger under `run_id`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    charge = ledger.get_charge(store, run_id)
    if charge is not None and charge.state == "committed" and (workdir / state.RESULT).exists() \
            and (workdir / state.SAMPLES).exists():
        return _stored_result(workdir)
    if charge is not None and charge.state == "refunded":
        raise LedgerStateError(f"Run {run_id!r} was refunded; start a new run with a new run id and workdir.")
    if charge is not None and charge.state == "committed":
        raise LedgerStateError(f"Run {run_id!r} is committed but its results are missing from {workdir}; "
                               "they cannot be recomputed without a new charge. Start a new run.")
    plan = _resolve_plan(store, dataset, config, len(sensitive), run_id, workdir, plan)
    if plan.record_count != len(sensitive):
        raise InvalidParameterError(
            f"The plan was made for {plan.record_count} records but the sensitive set has {len(sensitive)}; re-plan."
        )

    ledger.reserve(store, dataset, plan.events, run_id, description=f"PrivImage synthesis ({config.selection})",
                   actor=actor)
    state.write_json(workdir / state.PLAN, {"run_id": run_id, "dataset": dataset, "config": config.as_dict(),
                                            "plan": plan.to_json()})
    t0 = time.time()
    try:
        prep = _prepare_public(sensitive, public, config, workdir, progress)
    except BaseException as exc:
        if not (workdir / state.DATA_ACCESSED).exists():  # nothing sensitive was read: refund (rule 2)
            ledger.refund(store, run_id, reason=f"failed before reading sensitive data: {exc}", actor=actor)
        raise
    return _private_part(store, dataset, sensitive, public, config, plan, prep, run_id=run_id, workdir=workdir,
                         progress=progress, actor=actor, t0=t0)


class _Prepared:
    """What is known before any sensitive pixel is read: formats, the public classifier, the
    non-private pre-training of the baselines."""

    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)


def _prepare_public(sensitive: ImageDataset, public: ImageDataset, config: PrivImageConfig, workdir: Path,
                    progress: ProgressFn) -> _Prepared:
    device = pick_device(config.device)
    label_values = sensitive.label_set  # registered, public metadata
    channels = channels_of(sensitive)
    public_values = public.label_set
    if config.selection == "semantic" and len(public_values) < len(label_values):
        raise InvalidParameterError(
            f"The public set has {len(public_values)} classes but the sensitive set {len(label_values)}: the semantic "
            "query needs at least one public class per sensitive class. Use a larger public set."
        )
    pub_x = to_tensor(to_format(public.images, config.image_size, channels))
    pub_y = label_index(public.labels, public_values)
    classifier = None
    if config.selection == "semantic" and not (workdir / state.QUERY).exists():
        torch.manual_seed(config.seed)
        classifier = train_classifier(pub_x, pub_y, len(public_values), epochs=config.classifier_epochs,
                                      batch=config.classifier_batch, seed=config.seed, device=device,
                                      progress=progress, augmented=True)
    torch.manual_seed(config.seed)
    model = make_unet(config.image_size, channels, len(label_values), config.unet_channels, config.layers_per_block)
    if config.selection == "all":  # PDP-Diffusion-style: unconditional ("null" class) pre-training on everything
        null = torch.full((len(pub_x),), len(label_values), dtype=torch.long)
        model = pretrain(model, pub_x, null, steps=config.pretrain_steps, batch=config.pretrain_batch,
                         lr=config.pretrain_lr, train_timesteps=config.train_timesteps, seed=config.seed,
                         device=device, ckpt=workdir / state.PRETRAIN, progress=progress)
    return _Prepared(device=device, label_values=label_values, channels=channels, public_values=public_values,
                     pub_x=pub_x, pub_y=pub_y, classifier=classifier, model=model)


def _private_part(store: Store, dataset: str, sensitive: ImageDataset, public: ImageDataset, config: PrivImageConfig,
                  plan: PrivImagePlan, prep: _Prepared, *, run_id: str, workdir: Path, progress: ProgressFn,
                  actor: str, t0: float) -> SynthResult:
    state.touch_durable(workdir / state.DATA_ACCESSED)  # from here on, failures stay charged
    n_classes = len(prep.label_values)
    sens_x = to_tensor(to_format(sensitive.images, config.image_size, prep.channels))
    sens_y = label_index(sensitive.labels, prep.label_values)
    selection_info: dict = {}
    selected_index: list[int] | None = None  # public rows chosen by the DP query (for the audit's SDS)
    if config.selection == "semantic":
        query = state.read_json(workdir / state.QUERY)
        if query is None:
            if prep.classifier is None:
                raise LedgerStateError(f"{workdir}: the query classifier is missing; abandon this run.")
            top = top_k_predictions(prep.classifier, sens_x, config.k, prep.device)
            noisy = noisy_semantic_histogram(top, sens_y, n_classes, len(prep.public_values),
                                             plan.query_event.sigma, np.random.default_rng())  # OS entropy
            del top
            chosen = select_classes(noisy, config.k)
            query = {"noisy_histogram": noisy.tolist(), "chosen": chosen}
            state.write_json(workdir / state.QUERY, query)
        selection = build_selection(query["chosen"], prep.pub_y)
        names = {prep.label_values[r]: [public.class_names[prep.public_values[j]] if prep.public_values[j] <
                                        len(public.class_names) else str(prep.public_values[j]) for j in cols]
                 for r, cols in enumerate(selection.chosen)}
        selection_info = {"selected_public_classes": {sensitive.class_names[v] if v < len(sensitive.class_names)
                                                      else str(v): n for v, n in names.items()},
                          "selection_ratio": selection.ratio, "selected_images": int(len(selection.public_index))}
        selected_index = [int(i) for i in selection.public_index]
        prep.model = pretrain(prep.model, prep.pub_x[selection.public_index], torch.from_numpy(selection.new_labels),
                              steps=config.pretrain_steps, batch=config.pretrain_batch, lr=config.pretrain_lr,
                              train_timesteps=config.train_timesteps, seed=config.seed, device=prep.device,
                              ckpt=workdir / state.PRETRAIN, progress=progress)
    t_pre = time.time()

    dp = plan.dpsgd_event

    def charge_lost(started: int, checkpoint_step: int) -> None:
        wal = state.read_json(workdir / state.WAL)
        lost = started - checkpoint_step - sum(r["steps"] for r in wal["redo"])
        if lost > 0:
            rid = f"{run_id}:redo-{len(wal['redo']) + 1}"
            ledger.reserve(store, dataset, [DpSgd(dp.sample_rate, dp.noise_multiplier, lost)], rid,
                           description=f"PrivImage {run_id}: {lost} DP-SGD steps executed but lost in a crash",
                           actor=actor)
            wal["redo"].append({"run_id": rid, "steps": lost})
            state.write_json(workdir / state.WAL, wal)

    outcome = dp_finetune(
        prep.model, sens_x, torch.from_numpy(sens_y), sample_rate=plan.sample_rate,
        noise_multiplier=plan.noise_multiplier, steps=plan.steps, batch_size=config.batch_size,
        max_physical_batch=config.max_physical_batch, max_grad_norm=config.max_grad_norm, lr=config.lr,
        ema_decay=config.ema_decay, train_timesteps=config.train_timesteps, seed=config.seed, device=prep.device,
        workdir=workdir, ckpt_every=config.checkpoint_every, on_resume=charge_lost, progress=progress)
    del sens_x
    t_dp = time.time()

    model = make_unet(config.image_size, prep.channels, n_classes, config.unet_channels, config.layers_per_block)
    model.load_state_dict(outcome.weights)
    model_dir = save_model(model, workdir / state.MODEL_DIR, label_values=prep.label_values,
                           class_names=list(sensitive.class_names), image_size=config.image_size,
                           channels=prep.channels, train_timesteps=config.train_timesteps)
    positions = balanced_labels(config.n_samples, n_classes)
    images = sample_images(model, positions, image_size=config.image_size, channels=prep.channels,
                           train_timesteps=config.train_timesteps, ddim_steps=config.ddim_steps,
                           batch=config.sample_batch, seed=config.seed, device=prep.device, progress=progress)
    labels = np.asarray(prep.label_values, dtype=np.int64)[positions]
    np.savez_compressed(workdir / state.SAMPLES, images=images, labels=labels)
    t_sample = time.time()

    executed = _settle(store, run_id, plan, workdir, outcome.steps, actor)
    spent = ledger.budget(store, dataset).spent
    opacus_eps = _opacus_epsilon(outcome.opacus_history, config.delta)
    result = {
        "guarantee": {"type": "dp", **spent.as_dict()},
        "executed_events": [event_to_json(e) for e in executed],
        "parameters": {
            "mechanism": "privimage", "selection": config.selection, "k": config.k,
            "query_sigma": config.query_sigma if config.selection == "semantic" else None,
            "noise_multiplier": plan.noise_multiplier, "sample_rate": plan.sample_rate, "steps": plan.steps,
            "expected_batch_size": plan.expected_batch, "max_physical_batch": config.max_physical_batch,
            "max_grad_norm": config.max_grad_norm, "image_size": config.image_size, "channels": prep.channels,
            "lr": config.lr, "ema_decay": config.ema_decay, "pretrain_steps": config.pretrain_steps
            if config.selection != "none" else 0, "ddim_steps": config.ddim_steps, "n_samples": config.n_samples,
            "unet_channels": list(config.unet_channels), "target_epsilon": config.epsilon, "delta": config.delta,
            "redone_steps": sum(r["steps"] for r in state.read_json(workdir / state.WAL)["redo"]),
            **selection_info,
        },
        "internal": {
            "noisy_histogram": (state.read_json(workdir / state.QUERY) or {}).get("noisy_histogram"),
            "selected_public_indices": selected_index,
            "opacus_history": [list(h) for h in outcome.opacus_history],
            "opacus_epsilon_dpsgd": opacus_eps,
            "timings_s": {"classifier_and_pretraining": round(t_pre - t0, 2), "dp_finetuning": round(t_dp - t_pre, 2),
                          "sampling": round(t_sample - t_dp, 2)},
        },
        "artifacts": {"model": str(model_dir), "samples": str(workdir / state.SAMPLES),
                      "plan": str(workdir / state.PLAN), "finetune_checkpoint": str(workdir / state.FINETUNE),
                      **({"pretrain_checkpoint": str(workdir / state.PRETRAIN)}
                         if (workdir / state.PRETRAIN).exists() else {}),
                      **({"query": str(workdir / state.QUERY)} if (workdir / state.QUERY).exists() else {})},
    }
    state.write_json(workdir / state.RESULT, result)
    return _stored_result(workdir)


def _opacus_epsilon(history: list, delta: float) -> float | None:
    """Epsilon of the DP-SGD part as opacus' own RDP accountant reports it (same orders as ours)."""
    if not history:
        return None
    from opacus.accountants import RDPAccountant

    from accounting.epsilon import RDP_ORDERS

    acc = RDPAccountant()
    acc.history = [tuple(h) for h in history]
    return float(acc.get_epsilon(delta=delta, alphas=list(RDP_ORDERS)))


def _executed_main(plan: PrivImagePlan, workdir: Path, dpsgd_steps: int) -> list[MechanismEvent]:
    events: list[MechanismEvent] = [plan.query_event] if plan.query_event is not None else []
    if dpsgd_steps > 0:
        events.append(DpSgd(plan.sample_rate, plan.noise_multiplier, int(dpsgd_steps)))
    return events


def _settle(store: Store, run_id: str, plan: PrivImagePlan, workdir: Path, main_steps: int, actor: str
            ) -> list[MechanismEvent]:
    """Commit the main run and every redo charge; returns all executed events."""
    wal = state.read_json(workdir / state.WAL, {"started": 0, "redo": []})
    dp = plan.dpsgd_event
    executed = _executed_main(plan, workdir, main_steps)
    for redo in wal["redo"]:
        ev = [DpSgd(dp.sample_rate, dp.noise_multiplier, redo["steps"])]
        ledger.commit(store, redo["run_id"], ev, actor=actor)
        executed += ev
    # A redo reserved just before a crash but not yet recorded in the WAL: its steps were executed.
    orphan = ledger.get_charge(store, f"{run_id}:redo-{len(wal['redo']) + 1}")
    if orphan is not None and orphan.state == "reserved":
        ledger.commit(store, orphan.run_id, orphan.planned_events, actor=actor)
        executed += orphan.planned_events
    ledger.commit(store, run_id, _executed_main(plan, workdir, main_steps), actor=actor)
    return executed


def abandon_privimage(store: Store, run_id: str, workdir: Path, *, actor: str = "system") -> ledger.Charge:
    """Settle a run that will not be resumed: refund it if it never read sensitive data, else commit
    the query and the DP-SGD steps started (write-ahead counter), never fewer."""
    workdir = Path(workdir)
    charge = ledger.get_charge(store, run_id)
    if charge is None:
        raise LedgerStateError(f"No reservation for run {run_id!r}; nothing to abandon.")
    if charge.state in ("committed", "refunded"):
        return charge
    if not (workdir / state.DATA_ACCESSED).exists():
        return ledger.refund(store, run_id, reason="abandoned before reading sensitive data", actor=actor)
    saved = state.read_json(workdir / state.PLAN)
    if saved is None:
        raise LedgerStateError(f"{workdir} has no plan for run {run_id!r}; pass the run's own workdir.")
    plan = PrivImagePlan.from_json(saved["plan"])
    wal = state.read_json(workdir / state.WAL, {"started": 0, "redo": []})
    main_steps = wal["started"] - sum(r["steps"] for r in wal["redo"])
    if main_steps < 0 or main_steps > plan.steps:
        raise PrivReleaseError(f"{workdir}: inconsistent DP-SGD counter ({wal}); settle run {run_id!r} by hand.")
    _settle(store, run_id, plan, workdir, main_steps, actor)
    return ledger.get_charge(store, run_id)
