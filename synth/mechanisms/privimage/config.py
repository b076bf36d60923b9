"""PrivImage run configuration: every number is validated up front (accounting.validation)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from numbers import Real
from typing import Any

from accounting.errors import InvalidParameterError
from accounting.validation import (
    check_count,
    check_delta,
    check_epsilon,
    check_sensitivity,
    check_sigma,
)
from synth.mechanisms.privimage.precision import PRECISIONS

DP_OPTIMIZERS = ("adam", "sgd")
TRAINABLE = (
    "all",
    "no_down",
    "norms_emb",
)  # see synth.mechanisms.privimage.training.select_trainable
# PrivImage | DPDM-style (no pretraining) | PDP-Diffusion-style | procedural images only
# (docs/privimage-priors.md)
SELECTIONS = ("semantic", "none", "all", "procedural")
# where the private vote measures nearness (synth.mechanisms.privimage.vote)
# central_images = "auto": decided at plan time from public metadata
# (synth.mechanisms.privimage.central)
CENTRAL_AUTO = "auto"
FREQUENCY_AUTO = (
    "auto"  # frequency_warmup = "auto": decided at plan time (synth.mechanisms.privimage.frequency)
)
VOTE_SPACES = (
    "pixel",
    "embedding",
)


def _check_range(value: object, name: str, low: float, high: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not math.isfinite(float(value))
        or not low <= float(value) <= high
    ):
        raise InvalidParameterError(
            f"{name} must be a finite number in [{low:g}, {high:g}], got {value!r}."
        )
    return float(value)


def _check_decay(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not math.isfinite(float(value))
        or not 0 <= float(value) < 1
    ):
        raise InvalidParameterError(
            f"ema_decay must be a finite number in [0, 1), got {value!r} (e.g. 0.999)."
        )
    return float(value)


# The demo preset's numbers (PrivImageConfig.demo); `make reproduce` runs the same recipe on CPU.
# vote_pool 8: at the demo's vote sigma 2, eight candidates per image score better than four (CNN
# 0.883 against 0.831 at epsilon 10; BENCHMARKS-NOTEBOOK.md, "Private vote").
# max_physical_batch 320: a Poisson batch of expected size 250 (sd ~15) almost always fits one
# pass; smaller passes made a DP-SGD step 3-12% slower on 2 CPU cores.
DEMO_RECIPE: dict[str, Any] = dict(
    classifier_epochs=6,
    unet_channels=(16, 32, 32),
    pretrain_steps=2000,
    pretrain_batch=64,
    finetune_epochs=4.0,
    batch_size=250,
    max_physical_batch=320,
    lr=3e-4,
    checkpoint_every=16,
    ddim_steps=25,
    n_samples=4000,
    sample_batch=125,
    vote_sigma=2.0,
    vote_pool=8,
    vote_rounds=4,
    variation_strength=0.4,
    release_variations=3,
    release_variation_strength=0.15,
)


@dataclass
class PrivImageConfig:
    epsilon: float
    delta: float
    k: int = 3  # k1 = k2: top-k predictions per image and public classes per sensitive class
    # noise multiplier of the semantic query (std = sqrt(k) * query_sigma)
    query_sigma: float = 10.0
    image_size: int = 28  # 28 or 32
    # "semantic" (PrivImage), "none" (DPDM-style), "all" (PDP-Diffusion-style), "procedural"
    selection: str = "semantic"
    # semantic-query classifier (public data only)
    classifier_epochs: int = 6
    classifier_batch: int = 128
    # diffusion model
    unet_channels: tuple[int, ...] = (32, 64, 64)
    layers_per_block: int = 1
    train_timesteps: int = 1000
    # non-private pre-training on the selected public images
    pretrain_steps: int = 1500
    pretrain_batch: int = 64
    pretrain_lr: float = 2e-3
    # strength of the public-image augmentation (0 = off; synth.mechanisms.privimage.augment)
    pretrain_augment: float = 1.0
    # add elastic distortion + sharpening to it (ablation: blobbier samples)
    pretrain_elastic: bool = False
    # fraction of pre-training labels replaced by the null class (for guidance)
    label_dropout: float = 0.1
    # the prior when public data may not fit (docs/privimage-priors.md)
    # a public class fits a sensitive class if its noisy count >= this fraction of the class's
    # noisy size (and 4 noise stds); 0 = always fit (PrivImage)
    fit_threshold: float = 0.0
    # a public class may serve several sensitive classes (else one-to-one)
    share_public_classes: bool = False
    # procedural public images (synth.mechanisms.privimage.procedural) for selection "procedural"
    # and for
    # the classes that no public class fits
    procedural_images: int = 6000
    # DP central images: noisy means per class (queries); 0 = off; "auto": on where the classes are
    # large enough for the means to be more signal than noise (synth.mechanisms.privimage.central)
    central_images: int | str = "auto"
    central_sigma: float = 10.0  # their noise multiplier (synth.mechanisms.privimage.central)
    central_clip: float = 8.0  # L2 clip of one half-resolution image with pixels in [0, 1]
    central_steps: int = 500  # pre-training steps on the (augmented) central images
    # FETA-Pro's frequency warm-up (synth.mechanisms.privimage.frequency): a DP-MERF generator
    # trained against
    # one noisy random-feature embedding per class, its images pre-training the model before the
    # central images and DP-SGD. "auto": on where the classes are large enough for the embedding to
    # be more signal than noise (decided from public metadata)
    frequency_warmup: bool | str = "auto"
    frequency_sigma: float = 26.6  # the embedding's noise multiplier (sensitivity 1; FETA-Pro's)
    frequency_features: int = 4000  # random Fourier features
    frequency_generator_steps: int = 2000  # DP-MERF generator updates (post-processing)
    frequency_images: int = 10_000  # generator images the diffusion model pre-trains on
    frequency_steps: int = 1000  # diffusion pre-training steps on them
    # DP-SGD fine-tuning
    finetune_epochs: float = 20.0  # steps = ceil(epochs / q)
    batch_size: int = 256  # expected logical batch (Poisson sampling)
    max_physical_batch: int = 64
    max_grad_norm: float = 1.0
    # DP-SGD trains on diffusion timesteps >= this fraction of T (0 = all)
    finetune_t_min: float = 0.0
    lr: float = 3e-4  # Adam at 1e-3 under DP noise undoes pre-training (ablation)
    ema_decay: float = 0.999
    dp_optimizer: str = "adam"  # "adam" or "sgd" (momentum 0.9)
    noise_multiplicity: int = 1  # DPDM: diffusion-noise draws per example averaged before clipping
    trainable: str = "all"  # which weights DP-SGD updates: "all", "no_down", "norms_emb"
    checkpoint_every: int = 25  # DP-SGD steps between checkpoints
    secure_noise: bool = True  # DP noise from a CSPRNG, hardened against the float attack (README)
    # sampling
    ddim_steps: int = 50
    guidance: float = 0.0  # classifier-free guidance weight at sampling (0 = plain conditional)
    vote_sigma: float = (
        0.0  # private vote on the samples (synth.mechanisms.privimage.vote); 0 = off
    )
    vote_pool: int = 4  # candidates drawn per released image when the vote is on
    vote_rounds: int = 1  # Private Evolution rounds: each later round votes on variations
    vote_space: str = "pixel"  # nearest by pixel L2, or by cosine of EfficientNet-Lite0 features
    # of the previous winners (SDEdit: re-noised to this fraction of T)
    variation_strength: float = 0.5
    # low-strength variations released beside each voted (or sampled) image
    release_variations: int = 0
    # their SDEdit strength (post-processing: no privacy cost)
    release_variation_strength: float = 0.15
    n_samples: int = 5000  # total, balanced over the sensitive classes
    sample_batch: int = 250
    seed: int = 0
    device: str = "auto"  # "auto" = cuda if available, else cpu
    precision: str = "auto"  # UNet compute: "auto" (bfloat16 where native), "float32", "bfloat16"

    def __post_init__(self) -> None:
        self.epsilon = check_epsilon(self.epsilon, "target epsilon")
        self.delta = check_delta(self.delta)
        self.k = check_count(self.k, "k (semantic query top-k)")
        self.query_sigma = check_sigma(self.query_sigma, "query_sigma")
        if self.image_size not in (28, 32):
            raise InvalidParameterError(f"image_size must be 28 or 32, got {self.image_size!r}.")
        if self.selection not in SELECTIONS:
            raise InvalidParameterError(
                f"selection must be one of {SELECTIONS}, got {self.selection!r}."
            )
        for name in (
            "classifier_epochs",
            "classifier_batch",
            "layers_per_block",
            "train_timesteps",
            "pretrain_steps",
            "pretrain_batch",
            "batch_size",
            "max_physical_batch",
            "checkpoint_every",
            "ddim_steps",
            "n_samples",
            "sample_batch",
        ):
            setattr(self, name, check_count(getattr(self, name), name))
        self.unet_channels = tuple(
            check_count(c, "unet_channels entry") for c in self.unet_channels
        )
        if len(self.unet_channels) < 2 or any(c % 8 for c in self.unet_channels):
            raise InvalidParameterError(
                "unet_channels must have >= 2 entries, each a multiple of 8 (GroupNorm groups), "
                f"got {self.unet_channels}."
            )
        if self.image_size == 28 and len(self.unet_channels) > 3:
            raise InvalidParameterError(
                "At 28x28 the UNet can downsample at most twice: give at most 3 unet_channels."
            )
        self.finetune_epochs = check_sensitivity(self.finetune_epochs, "finetune_epochs")
        self.max_grad_norm = check_sensitivity(self.max_grad_norm, "max_grad_norm")
        self.finetune_t_min = _check_range(self.finetune_t_min, "finetune_t_min", 0.0, 0.9)
        self.lr = check_sensitivity(self.lr, "lr")
        self.pretrain_lr = check_sensitivity(self.pretrain_lr, "pretrain_lr")
        self.ema_decay = _check_decay(self.ema_decay)
        self.pretrain_augment = _check_range(self.pretrain_augment, "pretrain_augment", 0.0, 2.0)
        self.label_dropout = _check_range(self.label_dropout, "label_dropout", 0.0, 0.5)
        self._check_prior()
        self.guidance = _check_range(self.guidance, "guidance", 0.0, 10.0)
        self.noise_multiplicity = check_count(self.noise_multiplicity, "noise_multiplicity")
        if self.vote_sigma != 0:  # 0 turns the vote off; anything else is a noise multiplier
            self.vote_sigma = check_sigma(self.vote_sigma, "vote_sigma")
        self.vote_pool = check_count(self.vote_pool, "vote_pool")
        if self.vote_sigma and not 2 <= self.vote_pool <= 64:
            raise InvalidParameterError(
                "vote_pool must be between 2 and 64 candidates "
                f"per released image, got {self.vote_pool}."
            )
        self.vote_rounds = check_count(self.vote_rounds, "vote_rounds")
        if self.vote_rounds > 8:
            raise InvalidParameterError(
                f"vote_rounds must be between 1 and 8, got {self.vote_rounds}."
            )
        if self.vote_space not in VOTE_SPACES:
            raise InvalidParameterError(
                f"vote_space must be one of {VOTE_SPACES} (where the private vote measures which "
                f"candidate is nearest), got {self.vote_space!r}."
            )
        self.variation_strength = _check_range(
            self.variation_strength, "variation_strength", 0.05, 1.0
        )
        if (
            not isinstance(self.release_variations, int)
            or isinstance(self.release_variations, bool)
            or not 0 <= self.release_variations <= 15
        ):
            raise InvalidParameterError(
                "release_variations must be a whole number between 0 and 15 variations per "
                f"generated image, got {self.release_variations!r}."
            )
        self.release_variation_strength = _check_range(
            self.release_variation_strength, "release_variation_strength", 0.05, 1.0
        )
        if self.noise_multiplicity > 64:
            raise InvalidParameterError(
                f"noise_multiplicity must be at most 64, got {self.noise_multiplicity}."
            )
        if self.dp_optimizer not in DP_OPTIMIZERS:
            raise InvalidParameterError(
                f"dp_optimizer must be one of {DP_OPTIMIZERS}, got {self.dp_optimizer!r}."
            )
        if self.trainable not in TRAINABLE:
            raise InvalidParameterError(
                f"trainable must be one of {TRAINABLE}, got {self.trainable!r}."
            )
        if self.ddim_steps > self.train_timesteps:
            raise InvalidParameterError(
                f"ddim_steps ({self.ddim_steps}) cannot exceed train_timesteps "
                f"({self.train_timesteps})."
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise InvalidParameterError(f"seed must be a non-negative integer, got {self.seed!r}.")
        if not isinstance(self.pretrain_elastic, bool):
            raise InvalidParameterError(
                f"pretrain_elastic must be true or false, got {self.pretrain_elastic!r}."
            )
        if not isinstance(self.secure_noise, bool):
            raise InvalidParameterError(
                f"secure_noise must be true or false, got {self.secure_noise!r}."
            )
        if self.precision not in PRECISIONS:
            raise InvalidParameterError(
                f"precision must be one of {PRECISIONS}, got {self.precision!r}."
            )
        if self.device not in ("auto", "cpu") and not str(self.device).startswith("cuda"):
            raise InvalidParameterError(
                f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}."
            )

    def _check_prior(self) -> None:
        self.fit_threshold = _check_range(self.fit_threshold, "fit_threshold", 0.0, 1.0)
        if not isinstance(self.share_public_classes, bool):
            raise InvalidParameterError(
                f"share_public_classes must be true or false, got {self.share_public_classes!r}."
            )
        self.procedural_images = check_count(self.procedural_images, "procedural_images")
        if self.procedural_images > 100_000:
            raise InvalidParameterError(
                f"procedural_images must be at most 100,000, got {self.procedural_images}."
            )
        if self.central_images != CENTRAL_AUTO and (
            not isinstance(self.central_images, int)
            or isinstance(self.central_images, bool)
            or not 0 <= self.central_images <= 16
        ):
            raise InvalidParameterError(
                "central_images must be a whole number of noisy means per class between 0 (off) "
                f'and 16, or "{CENTRAL_AUTO}", got {self.central_images!r}.'
            )
        self.central_sigma = check_sigma(self.central_sigma, "central_sigma")
        self.central_clip = check_sensitivity(self.central_clip, "central_clip")
        self.central_steps = check_count(self.central_steps, "central_steps")
        if self.frequency_warmup not in (True, False, FREQUENCY_AUTO):
            raise InvalidParameterError(
                f'frequency_warmup must be true, false or "{FREQUENCY_AUTO}", got '
                f"{self.frequency_warmup!r}."
            )
        self.frequency_sigma = check_sigma(self.frequency_sigma, "frequency_sigma")
        self.frequency_features = check_count(self.frequency_features, "frequency_features")
        if self.frequency_features % 2 or not 64 <= self.frequency_features <= 100_000:
            raise InvalidParameterError(
                "frequency_features must be an even number between 64 and 100000, got "
                f"{self.frequency_features}."
            )
        for name in ("frequency_generator_steps", "frequency_images", "frequency_steps"):
            setattr(self, name, check_count(getattr(self, name), name))
        if self.frequency_images > 1_000_000:
            raise InvalidParameterError(
                f"frequency_images must be at most 1,000,000, got {self.frequency_images}."
            )

    @property
    def base_images(self) -> int:
        """Images drawn (and voted on) before each gets `release_variations` variations; the release
        keeps the first `n_samples` of them and their variations."""
        return -(-self.n_samples // (1 + self.release_variations))

    @property
    def candidates_per_image(self) -> int:
        """Images drawn per released image: `vote_pool` with the private vote on, else 1."""
        return self.vote_pool if self.vote_sigma else 1

    # ------------------------------------------------------------ presets
    @classmethod
    def demo(cls, epsilon: float, delta: float, **overrides: Any) -> PrivImageConfig:
        """CPU-sized (2 cores): 2,000 augmented public pre-training steps (about 7 minutes, then
        cached for later releases), 4 DP-SGD epochs with Adam at 3e-4, then four rounds of the
        private vote (Private Evolution): 8 candidates per released image, then three times 8 SDEdit
        variations of each winner at strength 0.4 (BENCHMARKS.md, "PrivImage recipe" and "Private
        vote"). Sampling batches of 125 run about 1.5x faster per image than 500 on 2 CPU cores
        (cache-sized activations)."""
        return cls(epsilon=epsilon, delta=delta, **{**DEMO_RECIPE, **overrides})

    @classmethod
    def tiny(cls, epsilon: float, delta: float, **overrides: Any) -> PrivImageConfig:
        """For tests: seconds, meaningless quality."""
        base = dict(
            classifier_epochs=1,
            classifier_batch=64,
            unet_channels=(8, 16),
            train_timesteps=100,
            pretrain_steps=3,
            pretrain_batch=16,
            finetune_epochs=1.0,
            batch_size=16,
            max_physical_batch=8,
            checkpoint_every=2,
            ddim_steps=3,
            n_samples=20,
            sample_batch=10,
            frequency_features=256,
            frequency_generator_steps=5,
            frequency_images=40,
            frequency_steps=3,
        )
        return cls(epsilon=epsilon, delta=delta, **{**base, **overrides})

    def with_(self, **changes: Any) -> PrivImageConfig:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["unet_channels"] = list(self.unet_channels)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivImageConfig:
        data = dict(data)
        data["unet_channels"] = tuple(data.get("unet_channels", (32, 64, 64)))
        return cls(**data)
