"""PrivImage run configuration: a frozen config (synth.config), every field checked up front."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from accounting.errors import InvalidParameterError
from synth import config as check
from synth.config import MechanismConfig
from synth.mechanisms.privimage.precision import PRECISIONS

# the diffusion samplers (synth.mechanisms.privimage.sampling.scheduler)
SAMPLERS = ("ddim", "dpm-solver++")

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


# The demo preset: CPU-sized (2 cores). 2,000 augmented public pre-training steps (cached for later
# releases), 4 DP-SGD epochs with Adam at 3e-4, then four rounds of the private vote (Private
# Evolution): 8 candidates per released image, then three times 8 SDEdit variations of each winner
# at strength 0.4 (BENCHMARKS.md, "PrivImage recipe" and "Private vote"). `make reproduce` runs the
# same recipe on CPU.
# vote_pool 8: at vote sigma 2, eight candidates per image score better than four
# (BENCHMARKS-NOTEBOOK.md, "Private vote"). vote_neighbours 4: each sensitive image's vote spread
# over its 4 nearest candidates (1/2 each, the same L2 sensitivity) outscores one whole vote for the
# nearest on bfloat16 candidates and ties with it on float32 ones (BENCHMARKS-NOTEBOOK.md,
# "Votes for the k nearest"). vote_sigma 1.75, not 2: the DP-SGD noise rises from 0.826 to 0.865
# and the vote's selection is less noisy; paired (two DP models, three noise draws) the vote scored
# +0.005 to +0.027 (BENCHMARKS-NOTEBOOK.md, "A less noisy vote"). max_physical_batch 320: a
# Poisson batch of expected size 250 (sd ~15) almost always fits one pass, and smaller passes make
# a DP-SGD step slower on a CPU; sample_batch 125: cache-sized activations, faster per image than
# larger batches on a CPU (BENCHMARKS-NOTEBOOK.md, "The main job" and "DP-SGD step cost").
# sampler DPM-Solver++ at 12 steps, not DDIM at 25: 44% of the UNet calls, `make demo` 10 -> 5.5
# minutes without bfloat16, and paired on the same DP models and vote noise its releases scored as
# well or better (BENCHMARKS-NOTEBOOK.md, "DPM-Solver++ instead of DDIM").
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
    sampler="dpm-solver++",
    ddim_steps=12,
    n_samples=4000,
    sample_batch=125,
    vote_sigma=1.75,
    vote_pool=8,
    vote_rounds=4,
    vote_neighbours=4,
    variation_strength=0.4,
    release_variations=3,
    release_variation_strength=0.15,
)
# The tiny preset, for tests: seconds, meaningless quality.
TINY_RECIPE: dict[str, Any] = dict(
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

# fields that must be positive whole numbers (PrivImageConfig.checked)
COUNTS = (
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
    "central_steps",
    "frequency_generator_steps",
    "frequency_steps",
)


@dataclass(frozen=True)
class PrivImageConfig(MechanismConfig):
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
    # sampling: the denoising steps of the sampler, "ddim" or "dpm-solver++" (the name ddim_steps
    # is kept so that recorded plans still load)
    ddim_steps: int = 50
    sampler: str = "ddim"
    guidance: float = 0.0  # classifier-free guidance weight at sampling (0 = plain conditional)
    vote_sigma: float = (
        0.0  # private vote on the samples (synth.mechanisms.privimage.vote); 0 = off
    )
    vote_pool: int = 4  # candidates drawn per released image when the vote is on
    # Private Evolution rounds: each later round votes on variations of the previous winners
    vote_rounds: int = 1
    # where the vote measures nearness: "pixel" (L2) or "embedding" (cosine of EfficientNet-Lite0
    # features)
    vote_space: str = "pixel"
    # each sensitive image votes 1/sqrt(k) for each of its k nearest candidates (L2 sensitivity 1)
    vote_neighbours: int = 1
    # how far a later round's variations re-noise a winner (SDEdit), as a fraction of T
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

    @classmethod
    def checked(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        c: dict[str, Any] = {
            **v,
            **{name: check.count(name, v[name]) for name in COUNTS},
            **cls._checked_budget(v),
            **cls._checked_shape(v),
            **cls._checked_training(v),
            **cls._checked_vote(v),
            **cls._checked_runtime(v),
            **cls._checked_prior(v),
        }
        cls._check_consistent(c)
        return c

    @staticmethod
    def _checked_budget(v: Mapping[str, Any]) -> dict[str, Any]:
        """The privacy budget and the private semantic query's settings."""
        return {
            "epsilon": check.epsilon("target epsilon", v["epsilon"]),
            "delta": check.delta("delta", v["delta"]),
            "k": check.count("k (semantic query top-k)", v["k"]),
            "query_sigma": check.sigma("query_sigma", v["query_sigma"]),
        }

    @staticmethod
    def _checked_shape(v: Mapping[str, Any]) -> dict[str, Any]:
        """Image size, selection mode and the UNet's channels."""
        return {
            "image_size": check.choice("image_size", v["image_size"], (28, 32)),
            "selection": check.choice("selection", v["selection"], SELECTIONS),
            "unet_channels": check.entries(
                "unet_channels", v["unet_channels"], check.count, least=2, example="[32, 64, 64]"
            ),
        }

    @staticmethod
    def _checked_training(v: Mapping[str, Any]) -> dict[str, Any]:
        """Optimisation, augmentation, label dropout, guidance, the sampler and noise
        multiplicity."""
        return {
            "sampler": check.choice(
                "sampler", v["sampler"], SAMPLERS, hint="the diffusion sampler's update rule"
            ),
            "finetune_epochs": check.positive("finetune_epochs", v["finetune_epochs"]),
            "max_grad_norm": check.positive("max_grad_norm", v["max_grad_norm"]),
            "finetune_t_min": check.number("finetune_t_min", v["finetune_t_min"], 0.0, 0.9),
            "lr": check.positive("lr", v["lr"]),
            "pretrain_lr": check.positive("pretrain_lr", v["pretrain_lr"]),
            "ema_decay": check.number(
                "ema_decay", v["ema_decay"], 0.0, 1.0, high_open=True, hint="e.g. 0.999"
            ),
            "pretrain_augment": check.number("pretrain_augment", v["pretrain_augment"], 0.0, 2.0),
            "pretrain_elastic": check.flag("pretrain_elastic", v["pretrain_elastic"]),
            "label_dropout": check.number("label_dropout", v["label_dropout"], 0.0, 0.5),
            "guidance": check.number("guidance", v["guidance"], 0.0, 10.0),
            "noise_multiplicity": check.whole("noise_multiplicity", v["noise_multiplicity"], 1, 64),
        }

    @staticmethod
    def _checked_vote(v: Mapping[str, Any]) -> dict[str, Any]:
        """The private vote among candidates and the variations of released images."""
        return {
            # 0 turns the vote off (kept as given); anything else is a noise multiplier
            "vote_sigma": (
                v["vote_sigma"]
                if v["vote_sigma"] == 0 and not isinstance(v["vote_sigma"], bool)
                else check.sigma("vote_sigma", v["vote_sigma"])
            ),
            "vote_pool": check.count("vote_pool", v["vote_pool"]),
            "vote_rounds": check.whole("vote_rounds", v["vote_rounds"], 1, 8),
            "vote_neighbours": check.whole(
                "vote_neighbours",
                v["vote_neighbours"],
                1,
                64,
                hint="nearest candidates each sensitive image votes for",
            ),
            "vote_space": check.choice(
                "vote_space",
                v["vote_space"],
                VOTE_SPACES,
                hint="where the private vote measures which candidate is nearest",
            ),
            "variation_strength": check.number(
                "variation_strength", v["variation_strength"], 0.05, 1.0
            ),
            "release_variations": check.whole(
                "release_variations",
                v["release_variations"],
                0,
                15,
                hint="variations per generated image",
            ),
            "release_variation_strength": check.number(
                "release_variation_strength", v["release_variation_strength"], 0.05, 1.0
            ),
        }

    @staticmethod
    def _checked_runtime(v: Mapping[str, Any]) -> dict[str, Any]:
        """DP optimiser, trainable part, seed, noise source, precision and device."""
        return {
            "dp_optimizer": check.choice("dp_optimizer", v["dp_optimizer"], DP_OPTIMIZERS),
            "trainable": check.choice("trainable", v["trainable"], TRAINABLE),
            "seed": check.whole("seed", v["seed"], 0),
            "secure_noise": check.flag("secure_noise", v["secure_noise"]),
            "precision": check.choice("precision", v["precision"], PRECISIONS),
            "device": check.device("device", v["device"]),
        }

    @staticmethod
    def _check_consistent(c: Mapping[str, Any]) -> None:
        """Checks across fields, once each field is valid on its own."""
        if any(ch % 8 for ch in c["unet_channels"]):
            raise InvalidParameterError(
                "unet_channels must have >= 2 entries, each a multiple of 8 (GroupNorm groups), "
                f"got {c['unet_channels']}."
            )
        if c["image_size"] == 28 and len(c["unet_channels"]) > 3:
            raise InvalidParameterError(
                "At 28x28 the UNet can downsample at most twice: give at most 3 unet_channels."
            )
        if c["vote_sigma"] and not 2 <= c["vote_pool"] <= 64:
            raise InvalidParameterError(
                "vote_pool must be between 2 and 64 candidates "
                f"per released image, got {c['vote_pool']}."
            )
        if c["vote_sigma"] and c["vote_neighbours"] > c["vote_pool"]:
            raise InvalidParameterError(
                f"vote_neighbours ({c['vote_neighbours']}) cannot exceed vote_pool "
                f"({c['vote_pool']}): a class may have only vote_pool candidates per image to "
                "vote for; lower vote_neighbours or raise vote_pool."
            )
        if c["ddim_steps"] > c["train_timesteps"]:
            raise InvalidParameterError(
                f"ddim_steps ({c['ddim_steps']}) cannot exceed train_timesteps "
                f"({c['train_timesteps']})."
            )

    @staticmethod
    def _checked_prior(v: Mapping[str, Any]) -> dict[str, Any]:
        """The public prior's fields (docs/privimage-priors.md): selection's fit, procedural
        images, central images and the frequency warm-up."""
        central = v["central_images"]
        if central != CENTRAL_AUTO:
            central = check.whole(
                "central_images",
                central,
                0,
                16,
                hint=f'noisy means per class, 0 = off, or "{CENTRAL_AUTO}"',
            )
        features = check.even("frequency_features", v["frequency_features"], 64, 100_000)
        return {
            "fit_threshold": check.number("fit_threshold", v["fit_threshold"], 0.0, 1.0),
            "share_public_classes": check.flag("share_public_classes", v["share_public_classes"]),
            "procedural_images": check.whole(
                "procedural_images", v["procedural_images"], 1, 100_000
            ),
            "central_images": central,
            "central_sigma": check.sigma("central_sigma", v["central_sigma"]),
            "central_clip": check.positive("central_clip", v["central_clip"]),
            "frequency_warmup": check.choice(
                "frequency_warmup", v["frequency_warmup"], (True, False, FREQUENCY_AUTO)
            ),
            "frequency_sigma": check.sigma("frequency_sigma", v["frequency_sigma"]),
            "frequency_features": features,
            "frequency_images": check.whole(
                "frequency_images", v["frequency_images"], 1, 1_000_000
            ),
        }

    @property
    def base_images(self) -> int:
        """Images drawn (and voted on) before each gets `release_variations` variations; the release
        keeps the first `n_samples` of them and their variations."""
        return -(-self.n_samples // (1 + self.release_variations))

    @property
    def candidates_per_image(self) -> int:
        """Images drawn per released image: `vote_pool` with the private vote on, else 1."""
        return self.vote_pool if self.vote_sigma else 1

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {"demo": DEMO_RECIPE, "tiny": TINY_RECIPE}
