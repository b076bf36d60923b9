"""FID-style distance with ImageNet-pretrained EfficientNet-Lite0 pooled features (torchmetrics'
FrechetInceptionDistance with a custom feature network). Not comparable with Inception FID."""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from audit.images import sample_idx, to_pm1
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.datasets import ImageDataset

METRIC_NAME = "FID (EfficientNet-Lite0 features)"
CHECK_FID = "fid_efficientnet_lite0"
_REAL_CACHE: dict[str, object] = {}  # real-set key -> metric holding that set's statistics (this process only)


class EfficientNetLite0Features(torch.nn.Module):
    """[-1, 1] images (N, 1|3, H, W) -> 1280-d pooled EfficientNet-Lite0 features."""

    num_features = 1280

    def __init__(self) -> None:
        super().__init__()
        from synth.features import efficientnet_lite0

        self.net = efficientnet_lite0("cpu")

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from synth.features import pooled_features, prepare

        return pooled_features(self.net, prepare(x.float()))


def _update(metric, images: np.ndarray, real: bool, batch: int = 256) -> None:
    for s in range(0, len(images), batch):
        metric.update(torch.from_numpy(to_pm1(images[s:s + batch])), real=real)


def fid(fake: np.ndarray, real: np.ndarray) -> float:
    """FID between two uint8 image sets; the real set's statistics are cached per process."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    key = hashlib.sha256(repr(real.shape).encode() + np.ascontiguousarray(real).tobytes()).hexdigest()
    metric = _REAL_CACHE.get(key)
    if metric is None:
        metric = FrechetInceptionDistance(feature=EfficientNetLite0Features(), reset_real_features=False,
                                          normalize=True)
        _update(metric, real, real=True)
        _REAL_CACHE.clear()  # keep one real set: its statistics are derived from sensitive data
        _REAL_CACHE[key] = metric
    metric.reset()  # keeps the real statistics (reset_real_features=False)
    _update(metric, fake, real=False)
    return float(metric.compute())


def run_fidelity(images: np.ndarray, sensitive: ImageDataset, policy: AuditPolicy,
                 heldout: ImageDataset | None = None) -> CheckResult:
    """FID of the release against the sensitive set; with held-out data, also the FID of an equally
    large real held-out sample (the floor this sample size allows: small-sample FID is biased)."""
    rng = np.random.default_rng(policy.seed)
    fake = images[sample_idx(len(images), policy.fid_samples, rng)]
    real = sensitive.images[sample_idx(len(sensitive), policy.fid_samples, rng)]
    if len(fake) < 2 or len(real) < 2:
        return CheckResult(CHECK_FID, "fidelity", None, f"{METRIC_NAME}: not computed (needs >= 2 images per set)",
                           {"n_fake": len(fake), "n_real": len(real)})
    value = fid(fake, real)
    baseline = None
    if heldout is not None and len(heldout) >= 2:
        baseline = fid(heldout.images[sample_idx(len(heldout), len(fake), rng)], real)
    passed = None if policy.max_fid is None else value <= policy.max_fid
    limit = "informational, no threshold" if policy.max_fid is None else f"max {policy.max_fid}"
    return CheckResult(CHECK_FID, "fidelity", passed,
                       f"{METRIC_NAME} vs sensitive set: {value:.2f} ({limit}; {len(fake)} vs {len(real)} images"
                       + (f"; real held-out sample scores {baseline:.2f})" if baseline is not None else ")"),
                       {"metric": METRIC_NAME, "value": value, "n_fake": len(fake), "n_real": len(real),
                        "reference": "sensitive (training) images", "real_heldout_baseline": baseline})
