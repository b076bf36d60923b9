"""One-run privacy audit of the DP-SGD implementation (Steinke, Nasr & Jagielski, NeurIPS 2023).

The mechanism's own DP-SGD code (its registry entry's `dpsgd_trainer`, PrivImage's `dp_finetune`, or
anything with its signature) trains with the release's clipping norm, noise multiplier, sampling
rate and step count on PUBLIC images plus m canaries, each included with probability 1/2. No
sensitive data is read, so the audit costs no budget. The bound (audit.one_run) is compared with the
epsilon the ledger charges for that DP-SGD run.

The trained network is a probe built to make each canary's signal as large as DP-SGD allows: a
"diffusion model" whose noise prediction is a per-class learned vector (a class table times a fixed
orthonormal basis, scaled by a gain). Every canary is a mislabelled out-of-distribution image
(uniform noise) carrying a label no other record has, so its clipped gradient lands in its own table
row and always points the same way (the "Dirac canary" of the paper's gradient-space audits,
realised through the data). A canary's score is how far its row moved against that direction. Any
change the implementation makes to sampling, clipping or noise changes exactly that movement,
whatever the network: DP-SGD's guarantee holds for every model, so a worst-case probe is a fair test
of the code.

Two scores (`score=`): "model" reads only the final weights (the release's view). "gradients" is a
white-box auditor (as in Nasr et al. 2023 and Steinke et al.'s white-box experiments): it records
the privatised gradient the optimiser receives at every step (the T outputs DP-SGD's accounting
covers) and scores each canary by the log-likelihood ratio of "its clipped gradient was in this
step's noisy sum with probability q", summed over steps. At small noise this sees the individual
steps' inclusions, which a sum over steps averages away, so it certifies more; at large noise the
two are alike (BENCHMARKS.md).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import torch

from accounting.errors import InvalidParameterError
from accounting.events import DpSgd
from audit.one_run import OneRunBound, one_run_bound
from synth import registry
from synth.kinds.datasets import ImageDataset, to_format
from synth.progress import ProgressFn, no_progress

# dp_finetune's signature; returns an object with `.weights` (state dict)
Trainer = Callable[..., Any]
TABLE_DIM = 16  # width of the class table: the probe's only parameters
GRADIENT_OVER_CLIP = 1000.0  # a canary's raw gradient norm in units of the clipping norm
Score = Literal["model", "gradients"]
SCORES = ("model", "gradients")


@dataclass(frozen=True)
class DpSgdSetting:
    """The DP-SGD run under audit: what the ledger charges (q, sigma, steps) and how it trains."""

    sample_rate: float
    noise_multiplier: float
    steps: int
    max_grad_norm: float
    delta: float
    lr: float = 1e-3
    ema_decay: float = 0.999
    description: str = ""
    optimizer: str = "adam"  # how the release trains (not privacy-relevant, but audited as run)
    noise_multiplicity: int = 1
    mechanism: str = "privimage"  # whose DP-SGD trainer runs (synth.registry.dpsgd_trainer)

    def __post_init__(self) -> None:
        k = round(1 / self.sample_rate) if 0 < self.sample_rate <= 1 else 0
        if k < 1 or abs(1 / k - self.sample_rate) > 1e-12:
            raise InvalidParameterError(
                "sample rate must be 1/K for an integer K (opacus' Poisson loader samples with "
                f"1/ceil(N/B)), got {self.sample_rate!r}."
            )
        if not (
            self.noise_multiplier > 0
            and self.max_grad_norm > 0
            and self.steps >= 1
            and 0 < self.delta < 1
        ):
            raise InvalidParameterError(
                "noise multiplier and clipping norm must be > 0, steps >= 1 and delta in (0, 1); "
                f"got {self.noise_multiplier}, {self.max_grad_norm}, {self.steps}, {self.delta}."
            )

    @classmethod
    def from_plan(
        cls, event: DpSgd | None, config: dict[str, Any], mechanism: str = "privimage"
    ) -> DpSgdSetting | None:
        """From the DP-SGD event a plan charges (`MechanismPlan.step_event`: sample rate, noise
        multiplier, steps) and the trainer's config (max_grad_norm, delta, lr, ema_decay); None
        when the plan charges no DP-SGD (e.g. k-SALSA)."""
        if event is None:
            return None
        return cls(
            float(event.sample_rate),
            float(event.noise_multiplier),
            int(event.steps),
            float(config["max_grad_norm"]),
            float(config["delta"]),
            float(config.get("lr", 1e-3)),
            float(config.get("ema_decay", 0.999)),
            "the release's planned DP-SGD",
            str(config.get("dp_optimizer", "adam")),
            int(config.get("noise_multiplicity", 1)),
            mechanism,
        )

    @property
    def claimed_epsilon(self) -> float:
        """RDP epsilon the ledger charges for this DP-SGD run alone (the reference accountant)."""
        from accounting.epsilon import epsilon_rdp
        from accounting.events import DpSgd

        return epsilon_rdp([DpSgd(self.sample_rate, self.noise_multiplier, self.steps)], self.delta)


class CanaryProbe(torch.nn.Module):
    """Noise prediction = gain * table[class] @ basis, shaped like the input image (see module
    doc)."""

    def __init__(self, rows: int, image_shape: tuple[int, ...], gain: float, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        pixels = int(np.prod(image_shape))
        basis, _ = torch.linalg.qr(torch.randn(pixels, TABLE_DIM, generator=gen))
        self.register_buffer("basis", basis.T.contiguous())  # (TABLE_DIM, pixels), orthonormal rows
        self.table = torch.nn.Embedding(rows, TABLE_DIM)
        self.gain = gain

    def forward(
        self, x_t: torch.Tensor, t: torch.Tensor, class_labels: torch.Tensor
    ) -> SimpleNamespace:
        pred = self.gain * self.table(class_labels) @ self.basis
        return SimpleNamespace(sample=pred.view_as(x_t))


@dataclass(frozen=True)
class CanaryRun:
    """Scores of one audit training run (internal numbers, no verdict)."""

    scores: np.ndarray  # per canary, higher = "included"
    included: np.ndarray  # the coin flips
    n_public: int
    batch_size: int
    seconds: float
    score: str = "model"
    # a score linear in the canary's signal, for the Gaussian fit (None: scores)
    linear: np.ndarray | None = None


def _batch_for(rate: float, n_min: int) -> tuple[int, int]:
    """(B, N) with N = K * B >= n_min, so opacus samples with exactly 1 / ceil(N / B) = rate."""
    k = round(1 / rate)
    b = max(1, math.ceil(n_min / k))
    return b, k * b


def _dataset(public: ImageDataset, included: np.ndarray, n_total: int, rng: np.random.Generator):
    n_pub = n_total - int(included.sum())
    pick = rng.choice(len(public), n_pub, replace=n_pub > len(public))
    x_pub = torch.from_numpy(
        to_format(public.images[pick], 28, 1).astype(np.float32) / 127.5 - 1.0
    )[:, None]
    classes = np.unique(public.labels)  # sorted: a label's class index is its position
    y_pub = torch.from_numpy(np.searchsorted(classes, public.labels[pick]).astype(np.int64))
    n_classes = len({int(v) for v in public.labels})
    canary_ids = np.flatnonzero(included)
    # OOD noise
    x_can = torch.from_numpy(rng.uniform(-1, 1, (len(canary_ids), 1, 28, 28)).astype(np.float32))
    # each canary: its own label, held by no other record
    y_can = torch.from_numpy(n_classes + canary_ids)
    return torch.cat([x_pub, x_can]), torch.cat([y_pub, y_can]).long(), n_pub, n_classes


def run_canaries(
    setting: DpSgdSetting,
    public: ImageDataset,
    *,
    trainer: Trainer | None = None,
    m: int = 1000,
    seed: int | None = None,
    progress: ProgressFn = no_progress,
    score: str = "model",
) -> CanaryRun:
    """Train `trainer` (default: the setting's mechanism's DP-SGD trainer) on public images +
    canaries; score them."""
    if score not in SCORES:
        raise InvalidParameterError(f"score must be one of {SCORES}, got {score!r}.")
    trainer = trainer or registry.dpsgd_trainer(setting.mechanism)
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    b, n = _batch_for(setting.sample_rate, int(included.sum()) + max(m // 2, 1))
    x, y, n_pub, n_classes = _dataset(public, included, n, rng)
    gain = math.sqrt(GRADIENT_OVER_CLIP * 28 * 28 * setting.max_grad_norm / 2)
    probe = CanaryProbe(n_classes + m, (1, 28, 28), gain, int(rng.integers(2**31)))
    with torch.no_grad():
        probe.table.weight.zero_()
        start = torch.nn.functional.normalize(
            torch.randn(
                m, TABLE_DIM, generator=torch.Generator().manual_seed(int(rng.integers(2**31)))
            ),
            dim=1,
        )
        probe.table.weight[n_classes:] = start
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the probe is tiny: extra threads only add contention
    steps: list[np.ndarray] = []
    try:
        with _record_canary_gradients(
            probe.table.weight, n_classes, steps, enabled=score == "gradients"
        ):
            out = _train(trainer, probe, x, y, setting, n, b, progress)
    finally:
        torch.set_num_threads(threads)
    if score == "gradients":
        scores, linear = gradient_scores(
            np.stack(steps, 1), setting.sample_rate, setting.noise_multiplier
        )
        return CanaryRun(scores, included, n_pub, b, time.perf_counter() - t0, score, linear)
    final = out.weights["table.weight"][n_classes:].double()
    # movement against the gradient
    scores = ((start.double() - final) * start.double()).sum(1).numpy()
    return CanaryRun(scores, included, n_pub, b, time.perf_counter() - t0)


@contextmanager
def _record_canary_gradients(
    table: torch.Tensor, first: int, steps: list[np.ndarray], enabled: bool
) -> Iterator[None]:
    """While active, append at every optimiser step each canary row's privatised gradient projected
    on the row's direction (the direction its clipped gradient points in). The hook is global
    because the trainer builds its own optimiser; it acts only on an optimiser that holds `table`,
    and never on opacus' DPOptimizer wrapper (whose .grad is not yet noised when its step
    starts)."""
    if not enabled:
        yield
        return
    from opacus.optimizers import DPOptimizer
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if isinstance(opt, DPOptimizer) or table.grad is None:
            return
        if not any(p is table for group in opt.param_groups for p in group["params"]):
            return
        with torch.no_grad():
            rows = table.detach()[first:].double()
            direction = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
            steps.append((table.grad.detach()[first:].double() * direction).sum(1).numpy())

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def gradient_scores(x: np.ndarray, q: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(log-likelihood-ratio score, linear score) from per-step projections x (canaries x steps).

    Each step is put in units of one clipped gradient by its robust noise scale (the median absolute
    deviation over canaries: at most a fraction q of them is in any step's batch), so y = I + N(0,
    sigma^2) with I ~ Bernoulli(q) for an included canary. The score sums, over steps, the
    log-likelihood ratio of that mixture against N(0, sigma^2). The scale is read from the data, not
    trusted from the claim, so an implementation that rescales noise and signal together is scored
    alike."""
    if x.ndim != 2 or x.shape[1] == 0:
        raise InvalidParameterError(
            "no optimiser step was recorded: the trainer did not train the probe."
        )
    mad = np.median(np.abs(x - np.median(x, axis=0)), axis=0) * 1.4826
    scale = np.maximum(mad, np.abs(x).max(axis=0) * 1e-12) + 1e-300  # no noise at all: scale ~ 0
    y = sigma * x / scale
    llr = np.logaddexp(math.log1p(-q), math.log(q) + (y - 0.5) / sigma**2).sum(1)
    return llr, y.sum(1)


def _train(
    trainer: Trainer,
    probe: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    setting: DpSgdSetting,
    n: int,
    b: int,
    progress: ProgressFn,
) -> Any:
    with tempfile.TemporaryDirectory(prefix="privrelease-audit-") as tmp:
        out = trainer(
            probe,
            x,
            y,
            sample_rate=1.0 / math.ceil(n / b),
            noise_multiplier=setting.noise_multiplier,
            steps=setting.steps,
            batch_size=b,
            max_physical_batch=max(4 * b, 256),
            max_grad_norm=setting.max_grad_norm,
            lr=setting.lr,
            ema_decay=setting.ema_decay,
            train_timesteps=1000,
            seed=0,
            device=torch.device("cpu"),
            workdir=Path(tmp),
            ckpt_every=setting.steps,
            on_resume=lambda started, done: None,
            progress=progress,
            optimizer=setting.optimizer,
            noise_multiplicity=setting.noise_multiplicity,
        )
    return out


def gdp_epsilon(mu: float, delta: float) -> float:
    """epsilon of mu-Gaussian DP at delta (Dong, Roth & Su 2022, Corollary 2.13)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if mu <= 0:
        return 0.0
    if not math.isfinite(mu) or mu > 60:
        return math.inf

    def excess(eps: float) -> float:
        return (
            norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta
        )

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(brentq(excess, 0.0, hi))


@dataclass(frozen=True)
class GaussianEstimate:
    """Gaussian fit of the two score distributions (Andrew et al., ICLR 2024): an estimate, not a
    proof."""

    mu: float
    mu_lower: float  # one-sided lower confidence limit of mu (normal approximation)
    eps: float
    eps_lower: float


def gaussian_estimate(run: CanaryRun, delta: float, confidence: float = 0.95) -> GaussianEstimate:
    from scipy.stats import norm

    # a log-likelihood ratio is not Gaussian
    linear = run.scores if run.linear is None else run.linear
    s_in, s_out = linear[run.included], linear[~run.included]
    sd = float(np.std(s_out, ddof=1))
    shift = float(np.mean(s_in)) - float(np.mean(s_out))
    if sd <= 1e-12 * max(abs(shift), 1e-300):  # excluded canaries did not move at all: no noise
        return GaussianEstimate(math.inf, math.inf, math.inf, math.inf)
    mu = shift / sd
    se = math.sqrt(np.var(s_in, ddof=1) / len(s_in) + np.var(s_out, ddof=1) / len(s_out)) / sd
    mu_lo = mu - norm.ppf(confidence) * se
    return GaussianEstimate(mu, mu_lo, gdp_epsilon(mu, delta), gdp_epsilon(mu_lo, delta))


@dataclass(frozen=True)
class ImplementationAudit:
    """compute_implementation_audit's numbers; check_implementation_audit turns them into a
    verdict."""

    setting: DpSgdSetting
    claimed_epsilon: float
    bound: OneRunBound
    gaussian: GaussianEstimate
    run: CanaryRun
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        b, g, s = self.bound, self.gaussian, self.setting
        return {
            "setting": {
                "sample_rate": s.sample_rate,
                "noise_multiplier": s.noise_multiplier,
                "steps": s.steps,
                "max_grad_norm": s.max_grad_norm,
                "delta": s.delta,
                "lr": s.lr,
                "ema_decay": s.ema_decay,
                "optimizer": s.optimizer,
                "noise_multiplicity": s.noise_multiplicity,
                "description": s.description,
            },
            "claimed_epsilon": self.claimed_epsilon,
            "eps_lower": b.eps_lower,
            "confidence": b.confidence,
            "canaries": b.m,
            "guesses": b.guesses,
            "correct": b.correct,
            "max_certifiable": b.max_certifiable,
            "per_guess_count": [list(r) for r in b.per_count],
            "gaussian": {
                "mu": g.mu,
                "mu_lower": g.mu_lower,
                "eps": g.eps,
                "eps_lower": g.eps_lower,
            },
            "score": self.run.score,
            "n_public": self.run.n_public,
            "batch_size": self.run.batch_size,
            "seconds": self.run.seconds,
            **self.extra,
        }


def compute_implementation_audit(
    setting: DpSgdSetting,
    public: ImageDataset,
    *,
    trainer: Trainer | None = None,
    m: int = 1000,
    confidence: float = 0.95,
    seed: int | None = None,
    progress: ProgressFn = no_progress,
    score: str = "model",
) -> ImplementationAudit:
    """Train once with canaries and compute the one-run epsilon lower bound beside the claimed
    epsilon. `score`: "model" (final weights only) or "gradients" (every step's privatised gradient;
    module doc)."""
    if m < 10:
        raise InvalidParameterError(f"the one-run audit needs at least 10 canaries, got {m}.")
    run = run_canaries(
        setting, public, trainer=trainer, m=m, seed=seed, progress=progress, score=score
    )
    bound = one_run_bound(run.scores, run.included, setting.delta, confidence)
    return ImplementationAudit(
        setting,
        setting.claimed_epsilon,
        bound,
        gaussian_estimate(run, setting.delta, confidence),
        run,
    )


def detection_text(audit: ImplementationAudit) -> tuple[str, str]:
    """(status, explanation): "violation" (proven at the confidence level), "suspect" (Gaussian
    estimate above the claim) or "consistent" (with what the audit could and could not have
    seen)."""
    b, g, claim = audit.bound, audit.gaussian, audit.claimed_epsilon
    head = (
        f"one-run bound eps >= {b.eps_lower:.3f} ({b.confidence:.0%}; {b.correct}/{b.guesses} "
        f"guesses right, {b.m} canaries) vs claimed eps {claim:.3f}"
    )
    if b.eps_lower > claim:
        return (
            "violation",
            f"{head}: the implementation leaks more than it charges (proven at {b.confidence:.0%})",
        )
    gauss = f"Gaussian estimate eps {g.eps:.3f} (lower limit {g.eps_lower:.3f}, mu {g.mu:.3f})"
    if g.eps_lower > claim:
        return "suspect", (
            f"{head}; {gauss} exceeds the claim: the canaries move more than the charged noise "
            "allows (an estimate that assumes Gaussian scores, not a proof)"
        )
    return "consistent", f"{head}; {blind_spot(audit)}; the {gauss} stays below the claim"


def blind_spot(audit: ImplementationAudit) -> str:
    """What a 'consistent' audit could not have detected, in words and numbers: the ceiling against
    the claim, the canaries it would take, and the epsilon of a sampling rate misreported by 2x as
    the example."""
    from accounting.epsilon import epsilon_rdp
    from accounting.events import DpSgd
    from audit.one_run import ceiling_search

    b, s, claim = audit.bound, audit.setting, audit.claimed_epsilon
    doubled = epsilon_rdp(
        [DpSgd(min(1.0, 2 * s.sample_rate), s.noise_multiplier, s.steps)], s.delta
    )
    example = (
        f"sampling at 2q = {min(1.0, 2 * s.sample_rate):.4g} while charging q (eps {doubled:.2f})"
    )
    if b.max_certifiable <= claim:
        need, peak = ceiling_search(claim, s.delta, b.confidence)
        more = (
            f"about {need:,} canaries would lift the ceiling above it"
            if need
            else f"no canary count can at delta {s.delta:g} (the ceiling peaks near {peak:.2f}: "
            "the bound's 2 m delta term grows with m)"
        )
        return (
            f"could not prove a violation: with {b.m} canaries even all-correct guesses certify at "
            f"most eps {b.max_certifiable:.2f} <= claimed {claim:.2f}, and {more}; a leak such as "
            f"{example} cannot be detected by this bound"
        )
    return (
        "no violation detected, but the bound certifies only part of a leak (ceiling "
        f"{b.max_certifiable:.2f} with {b.m} canaries): a subtler bug such as {example} can pass, "
        "its canaries separating too little to push the 95% bound above the claim"
    )


def plot_canary_scores(audit: ImplementationAudit, path: Path, title: str = "") -> str:
    """Histogram of the canary scores, included vs excluded, with the bound in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = audit.run
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    finite = run.scores[np.isfinite(run.scores)]
    bins = (
        np.linspace(finite.min(), finite.max(), 50).tolist() if finite.max() > finite.min() else 10
    )
    ax.hist(
        run.scores[~run.included], bins=bins, alpha=0.6, label=f"excluded ({(~run.included).sum()})"
    )
    ax.hist(
        run.scores[run.included], bins=bins, alpha=0.6, label=f"included ({run.included.sum()})"
    )
    ax.set_xlabel("canary score (row movement against its gradient)")
    ax.set_ylabel("canaries")
    ax.set_title(
        title
        or f"one-run audit: eps >= {audit.bound.eps_lower:.2f} vs claimed "
        f"{audit.claimed_epsilon:.2f}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)


def check_implementation_audit(audit: ImplementationAudit, artifacts_dir: Path | None = None):
    """The verdict as a CheckResult: fails on a proven violation or a Gaussian estimate above the
    claim."""
    from audit.report import CheckResult

    status, text = detection_text(audit)
    artifacts = {}
    if artifacts_dir is not None:
        artifacts["canary_scores"] = plot_canary_scores(
            audit, Path(artifacts_dir) / "canary_scores.png"
        )
    return CheckResult(
        "dpsgd_one_run_audit",
        "attack",
        status == "consistent",
        text,
        {"status": status, **audit.to_dict()},
        artifacts,
    )
