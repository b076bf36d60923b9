"""Run parameters of a k-anonymous release (k-SALSA and its three baselines), validated up front."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from numbers import Integral, Real
from typing import Any

from accounting.errors import InvalidParameterError

METHODS = ("ksalsa", "centroid", "pixel", "pca")
CONTENT_TARGETS = ("mean_features", "centroid")


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidParameterError(f"{name} must be an integer, got {value!r}.")
    if int(value) < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}, got {value}.")
    return int(value)


def _float(name: str, value: object, low: float, high: float, *, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise InvalidParameterError(f"{name} must be a finite number, got {value!r}.")
    v = float(value)
    if v < low or v > high or (open_low and v == low):
        bracket = "(" if open_low else "["
        raise InvalidParameterError(f"{name} must be in {bracket}{low:g}, {high:g}], got {v:g}.")
    return v


@dataclass
class KSalsaConfig:
    """k: anonymity parameter (every released image averages >= k records). method: ksalsa (local
    style alignment), centroid (G of the mean latent), pixel (k-Same-Pixel), pca (k-Same-PCA /
    k-Same-Eigen). lambda_content: weight of the content loss; 1 - lambda weighs the style loss.
    Both losses are relative errors (divided by the target's squared norm), so lambda trades
    comparable quantities."""

    k: int
    method: str = "ksalsa"
    lambda_content: float = 0.3
    steps: int = 30
    lr: float = 0.1
    cluster_batch: int = 32  # clusters optimised together in one batch
    grid: int = 4  # style patches: grid x grid per feature map
    style_layers: tuple[int, ...] = (0, 2)  # indices into the style net's early maps (0 = stem)
    feature_size: int = 64  # input size of the style/content CNN
    # or "centroid": pooled features of G(mean latent), as in the paper
    content_target: str = "mean_features"
    codec_epochs: int = 20
    codec_lr: float = 2e-3
    codec_batch: int = 128
    latent_dim: int = 32
    pca_components: int = 40
    # released size; None = the sensitive images' size (must divide by 4)
    image_size: int | None = None
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        self.k = _int("k", self.k, 2)
        if self.method not in METHODS:
            raise InvalidParameterError(
                f"method must be one of {', '.join(METHODS)}; got {self.method!r}."
            )
        self.lambda_content = _float("lambda_content", self.lambda_content, 0.0, 1.0)
        self.steps = _int("steps", self.steps, 0)
        self.lr = _float("lr", self.lr, 0.0, 10.0, open_low=True)
        self.cluster_batch = _int("cluster_batch", self.cluster_batch, 1)
        self.grid = _int("grid", self.grid, 1)
        self.style_layers = tuple(_int("style_layers entry", i, 0) for i in self.style_layers)
        if not self.style_layers:
            raise InvalidParameterError(
                "style_layers must name at least one feature map (e.g. (0, 2))."
            )
        self.feature_size = _int("feature_size", self.feature_size, 16)
        if self.content_target not in CONTENT_TARGETS:
            raise InvalidParameterError(
                f"content_target must be one of {CONTENT_TARGETS}; got {self.content_target!r}."
            )
        self.codec_epochs = _int("codec_epochs", self.codec_epochs, 0)
        self.codec_lr = _float("codec_lr", self.codec_lr, 0.0, 1.0, open_low=True)
        self.codec_batch = _int("codec_batch", self.codec_batch, 1)
        self.latent_dim = _int("latent_dim", self.latent_dim, 1)
        self.pca_components = _int("pca_components", self.pca_components, 1)
        if self.image_size is not None:
            self.image_size = _int("image_size", self.image_size, 8)
            if self.image_size % 4:
                raise InvalidParameterError(
                    "image_size must be a multiple of 4 (the codec "
                    f"halves it twice); got {self.image_size}."
                )
        self.seed = _int("seed", self.seed, 0)
        if self.device != "auto" and not str(self.device).startswith(("cpu", "cuda", "mps")):
            raise InvalidParameterError(
                f"device must be 'auto', 'cpu', 'cuda[:N]' or 'mps'; got {self.device!r}."
            )

    @classmethod
    def demo(cls, k: int = 5, method: str = "ksalsa") -> KSalsaConfig:
        """Whole run on MNIST-5k (4,000 images) in a few minutes on 2 CPU cores, codec training
        included."""
        return cls(k=k, method=method, steps=10, cluster_batch=64, feature_size=48, codec_epochs=15)

    @classmethod
    def tiny(cls, k: int = 2, method: str = "ksalsa") -> KSalsaConfig:
        """For tests: seconds on a few dozen images."""
        return cls(
            k=k,
            method=method,
            steps=3,
            cluster_batch=8,
            grid=2,
            feature_size=32,
            codec_epochs=1,
            latent_dim=8,
            pca_components=4,
        )

    def with_(self, **changes: Any) -> KSalsaConfig:
        return replace(self, **changes)

    def codec_key(self) -> dict[str, Any]:
        """The parameters the trained codec depends on (its cache key, with the public data)."""
        return {
            "latent_dim": self.latent_dim,
            "codec_epochs": self.codec_epochs,
            "codec_lr": self.codec_lr,
            "codec_batch": self.codec_batch,
            "seed": self.seed,
        }

    def public_parameters(self) -> dict[str, Any]:
        d = asdict(self)
        d["style_layers"] = list(self.style_layers)
        return d

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
