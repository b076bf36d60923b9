"""Semantic distribution similarity (SDS) between PrivImage's selected public set and the sensitive
set.

PrivImage compares semantic distributions obtained with its query classifier; that classifier is not
available to the audit, so SDS is defined here as: k-means (scikit-learn) on EfficientNet-Lite0
features of both sets together, one cluster histogram per set, SDS = cosine similarity of the two
histograms (1 = same semantic mix, 0 = disjoint). The summary says so."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from audit.images import embed_images, l2_normalise, sample_idx
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset

DEFINITION = "cosine similarity of EfficientNet-Lite0 k-means cluster histograms"


def sds(
    public_features: np.ndarray, sensitive_features: np.ndarray, clusters: int, seed: int = 0
) -> float:
    pub, sen = l2_normalise(public_features), l2_normalise(sensitive_features)
    both = np.concatenate([pub, sen])
    k = min(clusters, len(both))
    assign = KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(both)
    hp = np.bincount(assign[: len(pub)], minlength=k).astype(np.float64)
    hs = np.bincount(assign[len(pub) :], minlength=k).astype(np.float64)
    return float(hp @ hs / (np.linalg.norm(hp) * np.linalg.norm(hs)))


def compute_sds(
    selected_public: ImageDataset, sensitive: ImageDataset, policy: AuditPolicy
) -> dict:
    """SDS of feature samples of both sets (numbers only)."""
    from synth.kinds.datasets import resize

    rng = np.random.default_rng(policy.seed)
    pub = selected_public.images[sample_idx(len(selected_public), policy.feature_samples, rng)]
    sen = sensitive.images[sample_idx(len(sensitive), policy.feature_samples, rng)]
    if pub.shape[1:3] != sen.shape[1:3]:  # the feature network resizes anyway; align for batching
        pub = resize(pub, sen.shape[1])
    value = sds(embed_images(pub), embed_images(sen), policy.sds_clusters, policy.seed)
    return {
        "sds": value,
        "definition": DEFINITION,
        "clusters": policy.sds_clusters,
        "n_public": len(pub),
        "n_sensitive": len(sen),
    }


def check_sds(numbers: dict, policy: AuditPolicy) -> CheckResult:
    value = numbers["sds"]
    passed = None if policy.min_sds is None else value >= policy.min_sds
    limit = "informational, no threshold" if policy.min_sds is None else f"min {policy.min_sds}"
    return CheckResult(
        "semantic_distribution_similarity",
        "fidelity",
        passed,
        f"SDS selected-public vs sensitive {value:.3f} ({limit}; defined as {DEFINITION})",
        numbers,
    )


def run_sds(
    selected_public: ImageDataset, sensitive: ImageDataset, policy: AuditPolicy
) -> CheckResult:
    return check_sds(compute_sds(selected_public, sensitive, policy), policy)
