"""Non-private pre-training on public images and DP-SGD fine-tuning with opacus.

DP-SGD keeps a write-ahead counter: before each logical step (one Poisson-sampled batch, possibly
split by BatchMemoryManager into several physical batches) the count of steps *started* is made
durable, so settling a crashed run can never under-charge."""

from __future__ import annotations

import hashlib
import json
import secrets
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import UNet2DModel
from diffusers.training_utils import EMAModel
from filelock import FileLock
from opacus import PrivacyEngine
from opacus.optimizers import DPOptimizer
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch.utils.data import DataLoader, TensorDataset

from accounting.errors import PrivReleaseError
from synth.mechanisms.privimage import state
from synth.mechanisms.privimage.augment import augment_public
from synth.mechanisms.privimage.config import TRAINABLE
from synth.mechanisms.privimage.conv_grad_sample import install as install_conv_grad_sample
from synth.mechanisms.privimage.conv_grad_sample import per_example_gradients_only
from synth.mechanisms.privimage.model import ddpm_loss, make_scheduler
from synth.mechanisms.privimage.poisson_batches import PoissonBatches, physical_batches
from synth.mechanisms.privimage.precision import autocast
from synth.progress import ProgressFn, no_progress
from synth.tools import step_counter
from synth.tools.dp_noise import install as install_secure_noise

# bump when pretrain() changes what it computes (invalidates caches)
PRETRAIN_RECIPE = "pretrain-v2"
# Per-sample gradients by opacus' module hooks, with Conv2d's computed as one grouped convolution
# backward pass (synth/mechanisms/privimage/conv_grad_sample.py): faster on CPU than opacus' own
# conv sampler
# and than its functorch (vmap) mode, in float32 and under bfloat16 autocast (BENCHMARKS.md, "DP-SGD
# step cost").
GRAD_SAMPLE_MODE = "hooks"
# The DP backward pass differentiates the *sum* of the per-example losses, so opacus' hooks take
# each layer's output gradient as it is ("sum"); with a mean loss they would multiply every hooked
# layer's output gradient by the batch size first (one full-size multiply per layer, ~4% of a CPU
# step: BENCHMARKS.md). The optimiser still divides the clipped, noised sum by the expected batch
# size (its own loss_reduction stays "mean"), so the update is the same as before, only cheaper.
HOOKS_LOSS_REDUCTION = "sum"


def pretrain(
    model: UNet2DModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    batch: int,
    lr: float,
    train_timesteps: int,
    seed: int,
    device: torch.device,
    ckpt: Path,
    ckpt_every: int = 100,
    progress: ProgressFn = no_progress,
    augment: float = 0.0,
    label_dropout: float = 0.0,
    world_size: int = 1,
    elastic: bool = False,
    precision: str = "float32",
) -> torch.nn.Module:
    """Plain DDPM training (public data, no privacy cost); resumable from `ckpt`.

    With `world_size` > 1 (inside an initialised process group of that size) the model is wrapped in
    DistributedDataParallel and each rank draws `ceil(batch / world_size)` images, so the effective
    batch stays `batch`; only rank 0 writes the checkpoint.

    `augment` is the strength of augment_public (0 = off), `elastic` adds its elastic distortion and
    sharpening; `label_dropout` is the fraction of labels replaced by the null class (the last class
    embedding), so that sampling can use classifier-free guidance. `precision` is a resolved
    precision (synth.mechanisms.privimage.precision) for the forward pass."""
    sched = make_scheduler(train_timesteps)
    model.to(device).train()
    null_class = model.config.num_class_embeds - 1
    rank, net, batch = _ddp(model, world_size, batch)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    lr_sched = _schedule(opt, lr, steps)
    gen = torch.Generator().manual_seed(seed + rank)
    start = _resume_pretrain(ckpt, model, opt, lr_sched, gen, rank, seed)
    for step in range(start, steps):
        xb, yb = _public_batch(x, y, gen, batch, augment, elastic, label_dropout, null_class)
        with autocast(device, precision):
            loss = ddpm_loss(net, sched, xb.to(device), yb.to(device), generator=None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_sched.step()
        if rank == 0 and ((step + 1) % ckpt_every == 0 or step + 1 == steps):
            state.save_torch(
                ckpt,
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "lr": lr_sched.state_dict(),
                    "gen": gen.get_state(),
                    "step": step + 1,
                },
            )
        progress("pretraining", step + 1, steps)
    return model.eval()


def _resume_pretrain(
    ckpt: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    lr_sched: torch.optim.lr_scheduler.LRScheduler,
    gen: torch.Generator,
    rank: int,
    seed: int,
) -> int:
    """Restore a pre-training checkpoint if there is one; the step to start from (0 if none)."""
    saved = state.load_torch(ckpt)
    if saved is None:
        return 0
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    lr_sched.load_state_dict(saved["lr"])
    if rank == 0:
        gen.set_state(saved["gen"])
    else:  # rank 0's state is saved; another rank reseeds so that its draws stay its own
        gen.manual_seed(seed + rank + saved["step"])
    return saved["step"]


def _public_batch(
    x: torch.Tensor,
    y: torch.Tensor,
    gen: torch.Generator,
    batch: int,
    augment: float,
    elastic: bool,
    label_dropout: float,
    null_class: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pre-training batch: draw, augment, drop labels to the null class (draws from `gen` in
    that order)."""
    idx = torch.randint(0, len(x), (min(batch, len(x)),), generator=gen)
    xb, yb = (
        augment_public(x[idx], gen, augment, elastic=elastic, sharpen=elastic),
        y[idx].clone(),
    )
    if label_dropout > 0:
        yb[torch.rand(len(yb), generator=gen) < label_dropout] = null_class
    return xb, yb


def _ddp(model: torch.nn.Module, world_size: int, batch: int) -> tuple[int, torch.nn.Module, int]:
    """(rank, the module to call, per-rank batch): plain DDP averages the ranks' gradients."""
    if world_size == 1:
        return 0, model, batch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if torch.distributed.get_world_size() != world_size:
        raise PrivReleaseError(
            f"Internal error: world_size {world_size} but the process group has "
            f"{torch.distributed.get_world_size()} processes."
        )
    ids = [model.device.index] if model.device.type == "cuda" else None
    return torch.distributed.get_rank(), DDP(model, device_ids=ids), -(-batch // world_size)


def _writer(world_size: int) -> bool:
    """Only one process writes a run's shared files (rank 0 under torchrun)."""
    return world_size == 1 or torch.distributed.get_rank() == 0


def _schedule(
    opt: torch.optim.Optimizer, lr: float, steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """One-cycle (5% warm-up, cosine decay); a constant rate when there are too few steps to warm
    up."""
    if steps * 0.05 < 2:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)


def pretrain_cached(
    model: UNet2DModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    cache_dir: Path | None,
    workdir_ckpt: Path,
    **kwargs,
) -> torch.nn.Module:
    """`pretrain`, reusing a finished model from `cache_dir` when the same public images, labels,
    model and settings were pre-trained before. Public data only, so sharing it across releases (and
    datasets) costs no privacy; the key is a sha256 over everything that determines the weights."""
    if cache_dir is None:
        return pretrain(model, x, y, ckpt=workdir_ckpt, **kwargs)
    key = _pretrain_key(model, x, y, kwargs)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    if kwargs.get("world_size", 1) > 1:  # the ranks of one job train together: no lock
        return _pretrain_into_cache(model, x, y, Path(cache_dir), key, kwargs)
    # Two runs at once with the same public pre-training (two releases, or benchmark runs side by
    # side on one GPU): the second waits for the first and loads its model instead of training the
    # same weights into the same checkpoint files. The lock is released if its holder dies.
    with FileLock(str(Path(cache_dir) / f"pretrain-{key}.lock")):
        return _pretrain_into_cache(model, x, y, Path(cache_dir), key, kwargs)


def _pretrain_into_cache(
    model: UNet2DModel, x: torch.Tensor, y: torch.Tensor, cache_dir: Path, key: str, kwargs: dict
) -> torch.nn.Module:
    final = cache_dir / f"pretrain-{key}.pt"
    if final.exists():  # weights only: a cache file is never unpickled as code
        model.load_state_dict(torch.load(final, map_location="cpu", weights_only=True))
        kwargs.get("progress", no_progress)("pretraining (cached)", 1, 1)
        return model.to(kwargs["device"]).eval()
    model = pretrain(model, x, y, ckpt=cache_dir / f"pretrain-{key}.partial.pt", **kwargs)
    if not _writer(kwargs.get("world_size", 1)):
        return model
    state.save_torch(final, {k: v.detach().cpu() for k, v in model.state_dict().items()})
    (cache_dir / f"pretrain-{key}.partial.pt").unlink(missing_ok=True)
    return model


def _pretrain_key(model: UNet2DModel, x: torch.Tensor, y: torch.Tensor, settings: dict) -> str:
    h = hashlib.sha256(PRETRAIN_RECIPE.encode())
    # diffusers' private config entries ("_use_default_values" is a list made from a set, so its
    # order changes with each process's string hashing) would make the key differ between runs: only
    # public fields count
    architecture = {k: v for k, v in dict(model.config).items() if not k.startswith("_")}
    h.update(json.dumps(architecture, sort_keys=True, default=str).encode())
    # elastic=False and float32 compute exactly what recipe v2 did before the options existed: leave
    # them out
    keep = {
        k: v
        for k, v in settings.items()
        if k not in ("device", "progress", "ckpt_every")
        and not (k == "elastic" and v is False)
        and not (k == "precision" and v == "float32")
    }
    h.update(json.dumps(keep, sort_keys=True, default=str).encode())
    h.update(x.detach().cpu().numpy().tobytes())
    h.update(y.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:32]


@dataclass
class DpSgdOutcome:
    weights: dict  # EMA weights (the model we sample from), on CPU
    steps: int  # logical steps of the final trajectory (== planned when finished)
    opacus_history: list  # opacus' RDP accountant history [(sigma, q, steps)]
    opacus_sample_rate: float


def select_trainable(model: torch.nn.Module, which: str) -> list[torch.nn.Parameter]:
    """Freeze all but the chosen part: "all"; "no_down" (decoder, middle block, embeddings, output:
    the encoder of a model pre-trained on public images is kept); "norms_emb" (GroupNorm affine and
    the time/class embeddings: a few percent of the weights, as in bias/norm-only DP
    fine-tuning)."""
    if which not in TRAINABLE:
        raise PrivReleaseError(f"trainable must be one of {TRAINABLE}, got {which!r}.")
    for name, p in model.named_parameters():
        keep = (
            which == "all"
            or (which == "no_down" and not name.startswith("down_blocks"))
            or (which == "norms_emb" and ("norm" in name or "emb" in name))
        )
        p.requires_grad_(keep)
    return [p for p in model.parameters() if p.requires_grad]


def _average_draws(params: list[torch.nn.Parameter], n: int, multiplicity: int) -> None:
    """Noise multiplicity (DPDM): each example was repeated `multiplicity` times with independent
    diffusion noise and timestep; its per-sample gradient is the mean over its copies, taken before
    opacus clips it, so one example still contributes one clipped gradient (sensitivity
    unchanged)."""
    for p in params:
        gs = p.grad_sample  # type: ignore[attr-defined]
        p.grad_sample = gs.reshape(n, multiplicity, *gs.shape[1:]).mean(1)  # type: ignore[attr-defined]


def dp_finetune(
    model: UNet2DModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    batch_size: int,
    max_physical_batch: int,
    max_grad_norm: float,
    lr: float,
    ema_decay: float,
    train_timesteps: int,
    seed: int,
    device: torch.device,
    workdir: Path,
    ckpt_every: int,
    on_resume: Callable[[int, int], None],
    progress: ProgressFn = no_progress,
    optimizer: str = "adam",
    noise_multiplicity: int = 1,
    trainable: str = "all",
    world_size: int = 1,
    secure_noise: bool = True,
    precision: str = "float32",
    t_min: float = 0.0,
) -> DpSgdOutcome:
    """DP-SGD via opacus (Poisson sampling, per-sample clipping, physical batches as
    BatchMemoryManager splits them, EMA); with `world_size` > 1, one rank of opacus' DPDDP, charged
    as one process (synth/mechanisms/privimage/distributed.py). In one process the Poisson batches
    are opacus'
    draws made many steps ahead and the data sits on the device, so a step needs no host round-trip
    (poisson_batches.py).

    `on_resume(started, checkpoint_step)` is called before any step when a previous attempt left
    state behind; the caller charges executed-but-lost steps there (it may raise to refuse).

    With `precision` "bfloat16" the forward and backward passes run under autocast; every
    per-example gradient is brought to float32 before opacus clips, sums and noises it. `t_min` > 0
    draws the DP loss's diffusion timesteps from t_min * T up only (the high-noise ones, which set a
    digit's shape)."""
    model.to(device).train()
    params = select_trainable(model, trainable)
    opt = _optimizer(params, optimizer, lr)
    # a few fused kernels, not 3 per tensor
    ema = EMAModel(model.parameters(), decay=ema_decay, foreach=True)
    ckpt_path, writer = workdir / state.FINETUNE, _writer(world_size)
    wal = step_counter.read(workdir)
    done, accountant_state = _restore(ckpt_path, model, opt, ema, device)
    if wal["started"] > 0:
        on_resume(wal["started"], done)
    if done >= steps:
        history = list(accountant_state["history"]) if accountant_state else []
        return DpSgdOutcome(_ema_weights(model, ema), done, history, sample_rate)
    engine, dp_model, dp_opt, dp_loader = _make_private(
        model,
        opt,
        x,
        y,
        batch_size,
        noise_multiplier,
        max_grad_norm,
        sample_rate,
        device,
        world_size,
    )
    _harden(engine, dp_opt, secure_noise, accountant_state)
    sched = make_scheduler(train_timesteps)
    stepper = _DpStepper(
        dp_model, dp_opt, sched, params, noise_multiplicity, device, precision, t_min
    )
    physical = max(1, max_physical_batch // noise_multiplicity)
    steps_fn = _loader_steps if world_size > 1 else _presampled_steps
    with per_example_gradients_only(model):
        for step_batches in steps_fn(dp_loader, dp_opt, x, y, physical, device):
            _write_ahead(wal, workdir, writer)  # before the step's first physical batch runs
            stepper.run(step_batches)
            done += 1
            ema.step(model.parameters())
            progress("DP fine-tuning", done, steps)
            if writer and (done % ckpt_every == 0 or done == steps):
                _save_finetune(ckpt_path, model, opt, ema, engine, done)
            if done >= steps:
                break
    return DpSgdOutcome(
        _ema_weights(model, ema), done, list(engine.accountant.history), dp_loader.sample_rate
    )


def _optimizer(
    params: list[torch.nn.Parameter], optimizer: str, lr: float
) -> torch.optim.Optimizer:
    """The fine-tuning optimiser named by the config ("sgd" with momentum, else Adam)."""
    return (
        torch.optim.SGD(params, lr=lr, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.Adam(params, lr=lr)
    )


def _harden(
    engine: PrivacyEngine, dp_opt: DPOptimizer, secure_noise: bool, accountant_state: dict | None
) -> None:
    """Install the secure noise source, then restore a resumed run's accountant (in that order)."""
    # DP noise from a CSPRNG, hardened against the floating-point attack (tools/secure_noise.py)
    if secure_noise:
        install_secure_noise(dp_opt)
    if accountant_state is not None:
        engine.accountant.load_state_dict(accountant_state)


def _save_finetune(
    ckpt_path: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    ema: EMAModel,
    engine: PrivacyEngine,
    step: int,
) -> None:
    """Checkpoint the DP fine-tuning state (weights, optimiser, EMA, step, accountant) to resume."""
    state.save_torch(
        ckpt_path,
        {
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "ema": ema.state_dict(),
            "step": step,
            "accountant": engine.accountant.state_dict(),
        },
    )


@dataclass
class _DpStepper:
    """One logical DP-SGD step's work: per-sample gradients and an optimiser step per physical
    batch (the optimiser clips, sums and noises on the step's last one)."""

    dp_model: torch.nn.Module
    dp_opt: torch.optim.Optimizer
    sched: object
    params: list
    reps: int
    device: torch.device
    precision: str
    t_min: float

    def run(self, step_batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Run every physical batch of one logical step, in order."""
        for xb, yb in step_batches:
            _per_sample_gradients(
                self.dp_model,
                self.dp_opt,
                self.sched,
                self.params,
                xb,
                yb,
                self.reps,
                self.device,
                self.precision,
                self.t_min,
            )
            self.dp_opt.step()


Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


def _presampled_steps(
    dp_loader,
    dp_opt: DPOptimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    physical: int,
    device: torch.device,
) -> Iterator[Batches]:
    """One process: each logical step's physical batches, from Poisson indices drawn many steps
    ahead with the loader's own generator and rate (exactly its draws: poisson_batches.py), gathered
    from data resident on the device, split and signalled to the optimiser as opacus'
    BatchMemoryManager does. No host round-trip."""
    x, y = x.to(device), y.to(device)
    sampler = PoissonBatches(
        len(x),
        dp_loader.sample_rate,
        dp_loader.batch_sampler.generator,
        device,
        steps_per_epoch=len(dp_loader),
    )

    def one_step(indices: torch.Tensor) -> Batches:
        parts = physical_batches(indices, physical)
        for i, part in enumerate(parts):
            dp_opt.signal_skip_step(do_skip=i < len(parts) - 1)
            yield x[part], y[part]

    while True:
        yield one_step(sampler.next())


def _loader_steps(
    dp_loader,
    dp_opt: DPOptimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    physical: int,
    device: torch.device,
) -> Iterator[Batches]:
    """Under torchrun: the lockstep distributed loader through opacus' BatchMemoryManager, epoch
    after epoch."""
    while True:
        with BatchMemoryManager(
            data_loader=dp_loader, max_physical_batch_size=physical, optimizer=dp_opt
        ) as mem_loader:
            batches = iter(mem_loader)
            for first in batches:
                yield _until_step_end(first, batches, dp_opt)


def _until_step_end(first: tuple, rest: Iterator, dp_opt: DPOptimizer) -> Batches:
    """A logical step's physical batches: up to the one after which the optimiser took its step (the
    caller steps it after each batch; BatchMemoryManager signalled the others as skipped)."""
    batch = first
    while True:
        yield batch[0], batch[1]
        if not dp_opt._is_last_step_skipped:
            return
        batch = next(rest)


def scale_grad_once(optimizer: DPOptimizer) -> DPOptimizer:
    """Give this opacus optimiser the scale_grad below (this instance only)."""
    optimizer.scale_grad = types.MethodType(_scale_grad, optimizer)
    return optimizer


def _scale_grad(self: DPOptimizer) -> None:
    """opacus' DPOptimizer.scale_grad, reading `accumulated_iterations` once per step: opacus reads
    that property (a pass over every parameter's per-sample gradients) once per parameter, O(P^2)
    Python work: 3.9 ms a step for the demo UNet's 143 tensors on this project's 2-core VM, 0.3 ms
    read once; host time a GPU step, launch-bound at these sizes, pays in full
    (BENCHMARKS-NOTEBOOK.md, "DP-SGD step cost: what the rows say")."""
    if self.loss_reduction == "mean":
        divisor = self.expected_batch_size * self.accumulated_iterations
        torch._foreach_div_([p.grad for p in self.params], divisor)


def _write_ahead(wal: dict, workdir: Path, writer: bool) -> None:
    """Count one more step as started, durably, before it runs (rank 0 alone writes under
    torchrun; every rank keeps its count in `wal`)."""
    wal["started"] += 1
    if writer:
        step_counter.write(workdir, wal)


def _per_sample_gradients(
    dp_model: torch.nn.Module,
    dp_opt: torch.optim.Optimizer,
    sched,
    params: list,
    xb: torch.Tensor,
    yb: torch.Tensor,
    reps: int,
    device: torch.device,
    precision: str = "float32",
    t_min: float = 0.0,
) -> None:
    if len(xb) == 0:
        return _empty_batch(dp_opt, params)
    dp_opt.zero_grad()
    with autocast(device, precision):
        loss = ddpm_loss(
            dp_model,
            sched,
            xb.repeat_interleave(reps, 0).to(device),
            yb.repeat_interleave(reps, 0).to(device),
            reduction=HOOKS_LOSS_REDUCTION,
            t_min=t_min,
        )
    loss.backward()
    for p in (
        params
    ):  # opacus' hooks leave bfloat16 per-example gradients under autocast: clip in float32
        if p.grad_sample.dtype != p.dtype:
            p.grad_sample = p.grad_sample.to(p.dtype)
    if reps > 1:
        _average_draws(params, len(xb), reps)


def _empty_batch(dp_opt: torch.optim.Optimizer, params: list) -> None:
    """A Poisson sample can be empty: the step then releases noise only (zero clipped sum). Without
    per-sample gradients of length 0, opacus would re-process the previous step's (and fail)."""
    dp_opt.zero_grad()
    for p in params:
        p.grad_sample = p.new_zeros((0, *p.shape))


def _restore(
    ckpt_path: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    ema: EMAModel,
    device: torch.device,
) -> tuple[int, dict | None]:
    saved = state.load_torch(ckpt_path)
    if saved is None:
        return 0, None
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    ema.load_state_dict(saved["ema"])
    ema.to(device)
    return saved["step"], saved["accountant"]


def _make_private(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    noise_multiplier: float,
    max_grad_norm: float,
    sample_rate: float,
    device: torch.device,
    world_size: int = 1,
) -> tuple:
    # The DP noise and the Poisson sampling must not be predictable from the public config (a
    # known seed would let anyone subtract the noise): their generators are seeded from OS entropy.
    sampling_gen = torch.Generator().manual_seed(secrets.randbits(63))
    install_conv_grad_sample()
    module, poisson = model, True
    if world_size > 1:  # opacus' DPDDP and a lockstep distributed Poisson loader (already Poisson)
        from synth.mechanisms.privimage.ddp import dpddp, lockstep_poisson_loader

        module, poisson = dpddp(model), False
        loader = lockstep_poisson_loader(TensorDataset(x, y), batch_size, sampling_gen)
    else:
        loader = DataLoader(
            TensorDataset(x, y), batch_size=batch_size, shuffle=False, generator=sampling_gen
        )
    with (
        warnings.catch_warnings()
    ):  # opacus' "Secure RNG turned off" notice: the README explains the RNG
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp", secure_mode=False)
        dp_model, dp_opt, dp_loader = engine.make_private(
            module=module,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            poisson_sampling=poisson,
            grad_sample_mode=GRAD_SAMPLE_MODE,
            noise_generator=torch.Generator(device).manual_seed(secrets.randbits(63)),
            loss_reduction=HOOKS_LOSS_REDUCTION,
        )
    # average the noisy sum over the expected batch (see HOOKS_LOSS_REDUCTION)
    dp_opt.loss_reduction = "mean"
    scale_grad_once(dp_opt)
    if abs(dp_loader.sample_rate - sample_rate) > 1e-12:
        raise PrivReleaseError(
            f"Internal error: opacus samples with q={dp_loader.sample_rate} but the plan charged "
            f"q={sample_rate} (N={len(x)}, batch={batch_size}); nothing was trained."
        )
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    # opacus' functorch path (layers without a hooks sampler) asks CPU autocast for float32: a
    # notice per step
    warnings.filterwarnings(
        "ignore", message="In CPU autocast, but the target dtype", category=UserWarning
    )
    return engine, dp_model, dp_opt, dp_loader


def _ema_weights(model: torch.nn.Module, ema: EMAModel) -> dict:
    ema.copy_to(model.parameters())
    for p in model.parameters():
        p.requires_grad_(True)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
