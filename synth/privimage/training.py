"""Non-private pre-training on public images and DP-SGD fine-tuning with opacus.

DP-SGD keeps a write-ahead counter: before each logical step (one Poisson-sampled batch, possibly
split by BatchMemoryManager into several physical batches) the count of steps *started* is made
durable, so settling a crashed run can never under-charge."""
from __future__ import annotations

import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from diffusers.training_utils import EMAModel
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch.utils.data import DataLoader, TensorDataset

from accounting.errors import PrivReleaseError
from synth.privimage import state
from synth.privimage.model import ddpm_loss, make_scheduler
from synth.progress import ProgressFn, no_progress


def pretrain(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch: int, lr: float,
             train_timesteps: int, seed: int, device: torch.device, ckpt: Path, ckpt_every: int = 100,
             progress: ProgressFn = no_progress) -> torch.nn.Module:
    """Plain DDPM training (public data, no privacy cost); resumable from `ckpt`."""
    sched = make_scheduler(train_timesteps)
    model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    lr_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    gen = torch.Generator().manual_seed(seed)
    start = 0
    saved = state.load_torch(ckpt)
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        lr_sched.load_state_dict(saved["lr"])
        gen.set_state(saved["gen"])
        start = saved["step"]
    for step in range(start, steps):
        idx = torch.randint(0, len(x), (min(batch, len(x)),), generator=gen)
        loss = ddpm_loss(model, sched, x[idx].to(device), y[idx].to(device), generator=None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_sched.step()
        if (step + 1) % ckpt_every == 0 or step + 1 == steps:
            state.save_torch(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(), "lr": lr_sched.state_dict(),
                                    "gen": gen.get_state(), "step": step + 1})
        progress("pretraining", step + 1, steps)
    return model.eval()


@dataclass
class DpSgdOutcome:
    weights: dict                    # EMA weights (the model we sample from), on CPU
    steps: int                       # logical steps of the final trajectory (== planned when finished)
    opacus_history: list             # opacus' RDP accountant history [(sigma, q, steps)]
    opacus_sample_rate: float


def dp_finetune(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, sample_rate: float, noise_multiplier: float,
                steps: int, batch_size: int, max_physical_batch: int, max_grad_norm: float, lr: float, ema_decay: float,
                train_timesteps: int, seed: int, device: torch.device, workdir: Path, ckpt_every: int,
                on_resume: Callable[[int, int], None], progress: ProgressFn = no_progress) -> DpSgdOutcome:
    """DP-SGD via opacus (Poisson sampling, per-sample clipping, BatchMemoryManager, EMA).

    `on_resume(started, checkpoint_step)` is called before any step when a previous attempt left
    state behind; the caller charges executed-but-lost steps there (it may raise to refuse)."""
    sched = make_scheduler(train_timesteps)
    # The DP noise and the Poisson sampling must not be predictable from the public config (a
    # known seed would let anyone subtract the noise): their generators are seeded from OS entropy.
    model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ema = EMAModel(model.parameters(), decay=ema_decay)
    wal_path, ckpt_path = workdir / state.WAL, workdir / state.FINETUNE
    wal = state.read_json(wal_path, {"started": 0, "redo": []})
    saved = state.load_torch(ckpt_path)
    done = 0
    accountant_state = None
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        ema.load_state_dict(saved["ema"])
        ema.to(device)
        done, accountant_state = saved["step"], saved["accountant"]
    if wal["started"] > 0:
        on_resume(wal["started"], done)
        wal = state.read_json(wal_path, wal)  # on_resume may have recorded redo charges
    if done >= steps:
        return DpSgdOutcome(_ema_weights(model, ema), done,
                            list(accountant_state["history"]) if accountant_state else [], sample_rate)

    n = len(x)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False,
                        generator=torch.Generator().manual_seed(secrets.randbits(63)))  # Poisson sampling
    engine = PrivacyEngine(accountant="rdp", secure_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, dp_opt, dp_loader = engine.make_private(
            module=model, optimizer=opt, data_loader=loader, noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm, poisson_sampling=True, grad_sample_mode="hooks",
            noise_generator=torch.Generator(device).manual_seed(secrets.randbits(63)),
        )
    if abs(dp_loader.sample_rate - sample_rate) > 1e-12:
        raise PrivReleaseError(
            f"Internal error: opacus samples with q={dp_loader.sample_rate} but the plan charged q={sample_rate} "
            f"(N={n}, batch={batch_size}); nothing was trained."
        )
    if accountant_state is not None:
        engine.accountant.load_state_dict(accountant_state)

    def checkpoint(step: int) -> None:
        state.save_torch(ckpt_path, {"model": model.state_dict(), "opt": opt.state_dict(), "ema": ema.state_dict(),
                                     "step": step, "accountant": engine.accountant.state_dict()})

    in_step = False
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    while done < steps:
        with BatchMemoryManager(data_loader=dp_loader, max_physical_batch_size=max_physical_batch,
                                optimizer=dp_opt) as mem_loader:
            for xb, yb in mem_loader:
                if not in_step:  # first physical batch of a logical step: write ahead
                    wal["started"] += 1
                    state.write_json(wal_path, wal)
                    in_step = True
                if len(xb) > 0:
                    loss = ddpm_loss(dp_model, sched, xb.to(device), yb.to(device))
                    dp_opt.zero_grad()
                    loss.backward()
                dp_opt.step()
                if dp_opt._is_last_step_skipped:
                    continue
                in_step = False
                done += 1
                ema.step(model.parameters())
                progress("DP fine-tuning", done, steps)
                if done % ckpt_every == 0 or done == steps:
                    checkpoint(done)
                if done >= steps:
                    break
    history = list(engine.accountant.history)
    return DpSgdOutcome(_ema_weights(model, ema), done, history, dp_loader.sample_rate)


def _ema_weights(model: torch.nn.Module, ema: EMAModel) -> dict:
    ema.copy_to(model.parameters())
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
