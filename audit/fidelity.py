"""FID-style distance with ImageNet-pretrained EfficientNet-Lite0 pooled features (torchmetrics'
FrechetInceptionDistance with a custom feature network). Not comparable with Inception FID."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from audit.images import content_key, sample_idx, scoped_cache, to_pm1
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset

METRIC_NAME = "FID (EfficientNet-Lite0 features)"
CHECK_FID = "fid_efficientnet_lite0"


class EfficientNetLite0Features(torch.nn.Module):
    """[-1, 1] images (N, 1|3, H, W) -> 1280-d pooled EfficientNet-Lite0 features."""

    num_features = 1280

    def __init__(self) -> None:
        super().__init__()
        from synth.tools.pretrained_cnn import efficientnet_lite0

        self.net = efficientnet_lite0("cpu")

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from synth.tools.pretrained_cnn import pooled_features, prepare

        return pooled_features(self.net, prepare(x.float()))


def _update(metric, images: np.ndarray, real: bool, batch: int = 256) -> None:
    for s in range(0, len(images), batch):
        metric.update(torch.from_numpy(to_pm1(images[s : s + batch])), real=real)


def compute_fid(fake: np.ndarray, real: np.ndarray) -> float:
    """FID between two uint8 image sets; inside `audit.images.audit_cache()` the real set's
    statistics are computed once and reused (they are derived from sensitive data: never kept beyond
    the block)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    cache, key = scoped_cache(), content_key("fid-real:", real)
    metric = cache.get(key) if cache is not None else None
    if metric is None:
        metric = FrechetInceptionDistance(
            feature=EfficientNetLite0Features(), reset_real_features=False, normalize=True
        )
        _update(metric, real, real=True)
        if cache is not None:
            cache[key] = metric
    metric.reset()  # keeps the real statistics (reset_real_features=False)
    _update(metric, fake, real=False)
    return float(metric.compute())


@dataclass(frozen=True)
class FidelityNumbers:
    value: float | None  # None: fewer than 2 images in a set
    n_fake: int
    n_real: int
    # FID of an equally large real held-out sample (small-sample floor)
    real_heldout_baseline: float | None


def compute_fidelity(
    images: np.ndarray,
    sensitive: ImageDataset,
    policy: AuditPolicy,
    heldout: ImageDataset | None = None,
) -> FidelityNumbers:
    """FID of the release against the sensitive set; with held-out data, also the FID of an equally
    large real held-out sample (the floor this sample size allows: small-sample FID is biased)."""
    rng = np.random.default_rng(policy.seed)
    fake = images[sample_idx(len(images), policy.fid_samples, rng)]
    real = sensitive.images[sample_idx(len(sensitive), policy.fid_samples, rng)]
    if len(fake) < 2 or len(real) < 2:
        return FidelityNumbers(None, len(fake), len(real), None)
    value = compute_fid(fake, real)
    baseline = None
    if heldout is not None and len(heldout) >= 2:
        baseline = compute_fid(heldout.images[sample_idx(len(heldout), len(fake), rng)], real)
    return FidelityNumbers(value, len(fake), len(real), baseline)


def check_fidelity(f: FidelityNumbers, policy: AuditPolicy) -> CheckResult:
    if f.value is None:
        return CheckResult(
            CHECK_FID,
            "fidelity",
            None,
            f"{METRIC_NAME}: not computed (needs >= 2 images per set)",
            {"n_fake": f.n_fake, "n_real": f.n_real},
        )
    passed = None if policy.max_fid is None else f.value <= policy.max_fid
    limit = "informational, no threshold" if policy.max_fid is None else f"max {policy.max_fid}"
    baseline = f.real_heldout_baseline
    return CheckResult(
        CHECK_FID,
        "fidelity",
        passed,
        f"{METRIC_NAME} vs sensitive set: {f.value:.2f} ({limit}; {f.n_fake} vs {f.n_real} images"
        + (f"; real held-out sample scores {baseline:.2f})" if baseline is not None else ")"),
        {
            "metric": METRIC_NAME,
            "value": f.value,
            "n_fake": f.n_fake,
            "n_real": f.n_real,
            "reference": "sensitive (training) images",
            "real_heldout_baseline": baseline,
        },
    )


def run_fidelity(
    images: np.ndarray,
    sensitive: ImageDataset,
    policy: AuditPolicy,
    heldout: ImageDataset | None = None,
) -> CheckResult:
    return check_fidelity(compute_fidelity(images, sensitive, policy, heldout), policy)
