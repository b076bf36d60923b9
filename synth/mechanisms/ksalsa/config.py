"""Run parameters of a k-anonymous release (k-SALSA and its three baselines): a frozen config
(synth.config), every field checked up front."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from accounting.errors import InvalidParameterError
from synth import config as check
from synth.config import MechanismConfig

METHODS = ("ksalsa", "centroid", "pixel", "pca")
CONTENT_TARGETS = ("mean_features", "centroid")


@dataclass(frozen=True)
class KSalsaConfig(MechanismConfig):
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

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # the whole run on MNIST-5k (4,000 images) in a few minutes on 2 CPU cores, codec
        # training included
        "demo": dict(k=5, steps=10, cluster_batch=64, feature_size=48, codec_epochs=15),
        # for tests: seconds on a few dozen images
        "tiny": dict(
            k=2,
            steps=3,
            cluster_batch=8,
            grid=2,
            feature_size=32,
            codec_epochs=1,
            latent_dim=8,
            pca_components=4,
        ),
    }

    @classmethod
    def checked(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        size = v["image_size"]
        if size is not None:
            size = check.whole("image_size", size, 8)
            if size % 4:
                raise InvalidParameterError(
                    f"image_size must be a multiple of 4 (the codec halves it twice); got {size}."
                )
        return {
            **v,
            "k": check.whole("k", v["k"], 2, hint="every released image averages k records"),
            "method": check.choice("method", v["method"], METHODS),
            "lambda_content": check.number("lambda_content", v["lambda_content"], 0.0, 1.0),
            "steps": check.whole("steps", v["steps"], 0),
            "lr": check.number("lr", v["lr"], 0.0, 10.0, low_open=True),
            "cluster_batch": check.whole("cluster_batch", v["cluster_batch"], 1),
            "grid": check.whole("grid", v["grid"], 1),
            "style_layers": check.entries(
                "style_layers",
                v["style_layers"],
                lambda name, i: check.whole(name, i, 0),
                example="[0, 2]",
            ),
            "feature_size": check.whole("feature_size", v["feature_size"], 16),
            "content_target": check.choice("content_target", v["content_target"], CONTENT_TARGETS),
            "codec_epochs": check.whole("codec_epochs", v["codec_epochs"], 0),
            "codec_lr": check.number("codec_lr", v["codec_lr"], 0.0, 1.0, low_open=True),
            "codec_batch": check.whole("codec_batch", v["codec_batch"], 1),
            "latent_dim": check.whole("latent_dim", v["latent_dim"], 1),
            "pca_components": check.whole("pca_components", v["pca_components"], 1),
            "image_size": size,
            "seed": check.whole("seed", v["seed"], 0),
            "device": check.device("device", v["device"], ("cpu", "cuda", "mps")),
        }

    def codec_key(self) -> dict[str, Any]:
        """The parameters the trained codec depends on (its cache key, with the public data)."""
        return {
            "latent_dim": self.latent_dim,
            "codec_epochs": self.codec_epochs,
            "codec_lr": self.codec_lr,
            "codec_batch": self.codec_batch,
            "seed": self.seed,
        }

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
