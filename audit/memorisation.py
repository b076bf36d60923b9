"""Memorisation: distance to closest record (DCR) against training vs. held-out data.

For each released image: d_tr (nearest training image), d_ho (nearest held-out image), in pixel
space (RMS, pixels in [0, 1]) and in EfficientNet-Lite0 feature space (cosine distance). A near-copy
has d_tr / d_ho < near_copy_ratio and pixel d_tr < near_copy_max_distance. The fraction of released
images closer to training than to held-out is measured with training subsampled to the held-out size
(then ~0.5 is what an independent sample gives)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audit.images import embed_images, l2_normalise, nearest, rms_nearest, sample_idx
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset


def closer_to_train(
    images: np.ndarray,
    sensitive_images: np.ndarray,
    d_heldout: np.ndarray,
    n_heldout: int,
    repeats: int,
    rng: np.random.Generator,
) -> dict:
    """Fraction of released images nearer to a training image than to any held-out image, with the
    training set subsampled to the held-out size (a larger set is nearer by size alone), `repeats`
    times: mean and spread. About 0.5 is what a sample independent of the training set gives."""
    fractions = []
    for _ in range(repeats):
        sub = sample_idx(len(sensitive_images), n_heldout, rng)
        fractions.append(float(np.mean(rms_nearest(images, sensitive_images[sub])[0] < d_heldout)))
    f = np.asarray(fractions)
    return {
        "mean": float(f.mean()),
        "min": float(f.min()),
        "max": float(f.max()),
        "std": float(f.std(ddof=1)) if len(f) > 1 else 0.0,
        "repeats": repeats,
        "n_per_set": int(n_heldout),
    }


def _feature_dcr(
    images: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset,
    policy: AuditPolicy,
    rng: np.random.Generator,
) -> dict:
    m = min(policy.feature_samples, len(sensitive), len(heldout))
    q = sample_idx(len(images), policy.feature_samples, rng)
    fq = l2_normalise(embed_images(images[q]))
    ftr = l2_normalise(embed_images(sensitive.images[sample_idx(len(sensitive), m, rng)]))
    fho = l2_normalise(embed_images(heldout.images[sample_idx(len(heldout), m, rng)]))
    # for unit vectors, cosine distance = |a - b|^2 / 2
    d_tr = nearest(fq, ftr)[0] ** 2 / 2
    d_ho = nearest(fq, fho)[0] ** 2 / 2
    ratio = d_tr / np.maximum(d_ho, 1e-12)
    return {
        "n_release": len(q),
        "n_reference": m,
        "median_d_train": float(np.median(d_tr)),
        "median_d_heldout": float(np.median(d_ho)),
        "median_ratio": float(np.median(ratio)),
        "closer_to_train_fraction": float(np.mean(d_tr < d_ho)),
        "fraction_ratio_below_threshold": float(np.mean(ratio < policy.near_copy_ratio)),
    }


def nn_grid(
    images: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    order: np.ndarray,
    idx_tr: np.ndarray,
    idx_ho: np.ndarray | None,
    d_tr: np.ndarray,
    path: Path,
) -> str:
    """PNG grid: for the closest pairs, released image | nearest training | nearest held-out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3 if heldout is not None else 2
    fig, axes = plt.subplots(
        len(order), cols, figsize=(1.6 * cols, 1.6 * len(order)), squeeze=False
    )
    for r, i in enumerate(order):
        row = [
            (images[i], f"release #{i}"),
            (sensitive.images[idx_tr[i]], f"train d={d_tr[i]:.3f}"),
        ]
        if heldout is not None and idx_ho is not None:
            row.append((heldout.images[idx_ho[i]], "held-out"))
        for c, (im, title) in enumerate(row):
            axes[r, c].imshow(im, cmap="gray" if im.ndim == 2 else None, vmin=0, vmax=255)
            axes[r, c].set_title(title, fontsize=7)
            axes[r, c].axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)


@dataclass(frozen=True)
class MemorisationNumbers:
    """compute_memorisation's numbers; `order` ranks released rows from most to least copy-like."""

    details: dict[str, Any]
    order: np.ndarray
    idx_heldout: np.ndarray | None


def compute_memorisation(
    images: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    d_tr: np.ndarray,
    policy: AuditPolicy,
    features: bool = True,
) -> MemorisationNumbers:
    """`d_tr`: pixel RMS distance of each released image to its nearest training image."""
    rng = np.random.default_rng(policy.seed)
    details: dict = {
        "n_release": len(images),
        "n_train": len(sensitive),
        "pixel_distance": "RMS, pixels in [0,1]",
        "near_copy_rule": (
            f"d_tr/d_ho < {policy.near_copy_ratio} and d_tr < {policy.near_copy_max_distance}"
        ),
    }
    idx_ho = None
    if heldout is not None:
        d_ho, idx_ho = rms_nearest(images, heldout.images)
        ratio = d_tr / np.maximum(d_ho, 1e-12)
        near = (ratio < policy.near_copy_ratio) & (d_tr < policy.near_copy_max_distance)
        spread = closer_to_train(
            images, sensitive.images, d_ho, len(heldout), policy.dcr_repeats, rng
        )
        closer = spread["mean"]
        details.update(
            median_d_train=float(np.median(d_tr)),
            median_d_heldout=float(np.median(d_ho)),
            median_ratio=float(np.median(ratio)),
            closer_to_train_fraction_pixel=closer,
            closer_to_train_spread=spread,
        )
        order = np.argsort(ratio, kind="stable")
    else:
        # no held-out reference: only the absolute distance can flag a copy
        near = d_tr < policy.near_copy_max_distance
        closer = None
        details.update(
            median_d_train=float(np.median(d_tr)), note="no held-out data: absolute distance only"
        )
        order = np.argsort(d_tr, kind="stable")
    details["near_copy_count"] = int(near.sum())
    details["near_copy_fraction"] = float(near.mean())
    details["near_copy_release_rows"] = np.flatnonzero(near)[:50].tolist()
    if features and heldout is not None:
        details["feature_space"] = _feature_dcr(images, sensitive, heldout, policy, rng)
    return MemorisationNumbers(details, order, idx_ho)


def run_memorisation(
    images: np.ndarray,
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    d_tr: np.ndarray,
    idx_tr: np.ndarray,
    policy: AuditPolicy,
    artifacts_dir: Path | None,
    features: bool = True,
) -> CheckResult:
    """`d_tr`, `idx_tr`: pixel RMS distance / index of each released image's nearest training
    image. The numbers (compute_memorisation), then their verdict against `policy` and, with an
    `artifacts_dir`, the grid of the most copy-like pairs."""
    numbers = compute_memorisation(images, sensitive, heldout, d_tr, policy, features)
    details, order, idx_ho = dict(numbers.details), numbers.order, numbers.idx_heldout
    closer = details.get("closer_to_train_fraction_pixel")
    checks = {"near_copies": details["near_copy_fraction"] <= policy.max_near_copy_fraction}
    if policy.max_closer_to_train_fraction is not None and closer is not None:
        checks["closer_to_train"] = closer <= policy.max_closer_to_train_fraction
    details["checks"] = checks
    artifacts = {}
    if artifacts_dir is not None:
        artifacts["nearest_neighbour_grid"] = nn_grid(
            images,
            sensitive,
            heldout,
            order[: policy.grid_pairs],
            idx_tr,
            idx_ho,
            d_tr,
            Path(artifacts_dir) / "nearest_pairs.png",
        )
    spread = details.get("closer_to_train_spread") or {}
    closer_txt = (
        (
            f"{closer:.2f} closer to train than held-out (equal-size sets, {policy.dcr_repeats} "
            f"draws, range {spread.get('min', 0):.2f}-{spread.get('max', 0):.2f}; ~0.5 healthy)"
        )
        if closer is not None
        else "no held-out"
    )
    summary = (
        f"{details['near_copy_count']} near-copies ({details['near_copy_fraction']:.2%}, max "
        f"{policy.max_near_copy_fraction:.2%}; rule {details['near_copy_rule']}); {closer_txt}"
    )
    if "feature_space" in details:
        summary += (
            "; feature-space closer fraction "
            f"{details['feature_space']['closer_to_train_fraction']:.2f}"
        )
    return CheckResult(
        "memorisation_dcr", "attack", all(checks.values()), summary, details, artifacts
    )
