"""Plan-time estimate of the cluster-membership attack on a k-anonymous release, from PUBLIC data
only.

The audit's attack (audit/kanon_attacks.py) ranks a representative's k sources against k held-out
images by similarity; its top-k precision is high when clusters are tight next to a random image,
which depends on k, on how many records there are (more records, tighter clusters) and on the kind
of images. So the plan re-enacts the release on public images of the same shape: a stand-in
"sensitive" part clustered into groups of k (same-size clustering of PCA codes), each group averaged
in pixel space (k-Same-Pixel, the average that gives membership away most), attacked with the
audit's own code, held-out negatives from the rest of the public set. Nothing sensitive is read: the
inputs are the public set, k, the record count and the image shape (all public).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from accounting import ledger
from audit.kanon_attacks import compute_kanon_attacks
from audit.policy import AuditPolicy
from release.artifacts import public_sha256
from release.spec import ReleaseSpec
from synth import registry
from synth.kinds.datasets import ImageDataset, conform
from synth.progress import ProgressFn, no_progress
from synth.registry import Data, MechanismPlan
from synth.tools.same_size_clusters import same_size_clusters

PROXY_MAX = 1200  # stand-in records at most (seconds per k on 2 CPU cores)
HELDOUT_MIN = 200  # public images kept aside as the attack's non-members
ATTACKED = 150  # representatives attacked per k
SEARCH = 8  # at most this many k values tried in all


@dataclass(frozen=True)
class MembershipEstimate:
    k: int
    precision: float  # estimated attack precision at k
    threshold: float  # the policy's kanon_max_attack_precision
    proxy_records: int  # public stand-in records (the real record count may be larger)
    record_count: int
    source: str
    passing_k: int | None  # smallest k tried whose estimate stays <= threshold (None: none did)
    tried: dict[int, float] = field(default_factory=dict)

    @property
    def likely_refused(self) -> bool:
        return self.precision > self.threshold

    def warning(self) -> str | None:
        if not self.likely_refused:
            return None
        k_max = max(self.tried)
        fix = (
            f"k = {self.passing_k} stayed under it there ({self.tried[self.passing_k]:.3f})"
            if self.passing_k
            else (
                f"no k up to {k_max} stayed under it there ({self.tried[k_max]:.3f} at k = {k_max})"
            )
        )
        more = (
            f" Your {self.record_count} records may cluster more tightly than {self.proxy_records} "
            "public ones, so the k that passes may be larger still."
            if self.record_count > self.proxy_records
            else ""
        )
        return (
            "The cluster-membership audit will likely refuse this release: re-enacted on "
            f"{self.proxy_records} public images of this shape ({self.source}), averages of k = "
            f"{self.k} images let the attack reach top-k precision {self.precision:.3f} > the "
            f"policy's kanon_max_attack_precision {self.threshold:g}; {fix}.{more} Raise k in the "
            "spec's mechanism table before the run, or accept a refused release. (Estimated from "
            "public data only: pixel averages, pixel-space ranking.)"
        )


def _proxy_images(public: ImageDataset, shape: tuple[int, ...]) -> np.ndarray:
    """Public images as uint8 of the release's shape (resized, grey <-> RGB)."""
    channels = shape[2] if len(shape) == 3 else 1
    x = conform(public, shape[0], channels)  # (N, C, H, W) in [-1, 1]
    x = np.rint((x + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    return x[:, 0] if channels == 1 else np.moveaxis(x, 1, -1)


def _precision(
    images: np.ndarray, codes: np.ndarray, heldout: np.ndarray, k: int, seed: int
) -> float:
    clusters = same_size_clusters(codes, k).clusters
    reps = (
        np.stack([images[c].astype(np.float64).mean(0) for c in clusters]).round().astype(np.uint8)
    )
    labels = np.zeros(len(images), np.int64)  # labels play no part in the attack
    policy = AuditPolicy(feature_samples=ATTACKED, seed=seed)
    numbers = compute_kanon_attacks(
        reps,
        clusters,
        ImageDataset(images, labels),
        ImageDataset(heldout, np.zeros(len(heldout), np.int64)),
        k,
        policy,
        features=False,
    )
    return float(numbers.membership["attack_precision"])


def _candidates(k: int, k_max: int) -> list[int]:
    out: list[int] = []
    c = k
    while c < k_max and len(out) < SEARCH - 1:
        c = min(k_max, max(c + 1, int(round(c * 1.6))))
        out.append(c)
    return out


def estimate_membership(
    public: ImageDataset,
    record_count: int,
    k: int,
    image_shape: tuple[int, ...],
    threshold: float,
    *,
    seed: int = 0,
    progress: ProgressFn = no_progress,
) -> MembershipEstimate | None:
    """The attack's precision re-enacted on public data at `k` and, if that exceeds `threshold`, at
    larger k until one stays under it. None when the public set is too small to stand in for
    clusters of k."""
    from sklearn.decomposition import PCA

    images = _proxy_images(public, tuple(image_shape))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(images))
    m = min(int(record_count), PROXY_MAX, len(images) - HELDOUT_MIN)
    if m < 4 * k:
        return None
    stand_in, heldout = images[order[:m]], images[order[m : m + max(HELDOUT_MIN, 4 * k)]]
    flat = stand_in.reshape(m, -1).astype(np.float64) / 255.0
    codes = PCA(min(32, m - 1, flat.shape[1]), random_state=seed).fit_transform(flat)
    tried: dict[int, float] = {}

    def attack(c: int) -> bool:
        tried[c] = _precision(stand_in, codes, heldout, c, seed)
        progress("k-anonymity attack estimate", len(tried), SEARCH)
        return tried[c] <= threshold

    progress("k-anonymity attack estimate", 0, SEARCH)
    passing, failing = (k, None) if attack(k) else (None, k)
    for c in [] if passing else _candidates(k, max(k, m // 4)):  # grow k until the estimate passes
        if attack(c):
            passing = c
            break
        failing = c
    while (
        passing and failing and passing - failing > 1 and len(tried) < SEARCH
    ):  # then narrow it down
        mid = (passing + failing) // 2
        passing, failing = (mid, failing) if attack(mid) else (passing, mid)
    progress("k-anonymity attack estimate", SEARCH, SEARCH)
    return MembershipEstimate(
        k, tried[k], threshold, m, int(record_count), public.source or "public data", passing, tried
    )


_ESTIMATES: dict[
    tuple, MembershipEstimate | None
] = {}  # public data only: the same question gets the same answer


def plan_warning(
    spec: ReleaseSpec,
    ds: ledger.Dataset,
    mplan: MechanismPlan,
    public: Data | None,
    progress: ProgressFn,
) -> list[str]:
    """Whether the audit's cluster-membership attack will likely refuse a k-anonymous release,
    re-enacted on the public data (`estimate_membership`): reads nothing sensitive, so the warning
    may be shown as it is. Remembered per process by everything that determines it."""
    k, threshold = (
        int(mplan.parameters["k"]),
        AuditPolicy.from_dict(spec.policy).kanon_max_attack_precision,
    )
    key = (public_sha256(public), ds.record_count, k, tuple(mplan.output_shape), threshold)
    if key not in _ESTIMATES:
        _ESTIMATES[key] = estimate_membership(
            registry.images_only(public, "The k-anonymity estimate"),
            ds.record_count,
            k,
            tuple(mplan.output_shape),
            threshold,
            progress=lambda stage, done, total: progress(f"plan: {stage}", done, total),
        )
    estimate = _ESTIMATES[key]
    warning = estimate.warning() if estimate is not None else None
    return [warning] if warning else []
