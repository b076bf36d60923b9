"""Attacks on k-anonymous releases (k-SALSA's threat model).

- Cluster-membership attack: for a representative, candidates = its k source records + k records
  that are not in its cluster (held-out images when available, else other sensitive records);
  rank them by similarity to the representative; top-k precision (chance 50%). Measures whether
  an attacker holding candidate images can tell who was averaged into a released image.
- Re-identification: is the single sensitive record nearest to the representative one of its
  sources (rate; chance k/n). Measures whether a representative points back to one individual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from accounting.errors import DataFormatError
from audit.images import embed_images, flat01, l2_normalise, rms_nearest, sample_idx
from audit.policy import AuditPolicy
from audit.report import CheckResult
from synth.kinds.datasets import ImageDataset


def _validate_clusters(
    clusters: list[np.ndarray], n_reps: int, n_sensitive: int
) -> list[np.ndarray]:
    if len(clusters) != n_reps:
        raise DataFormatError(
            f"{len(clusters)} clusters for {n_reps} released representatives; give one array of "
            "sensitive indices per representative, in release order."
        )
    out = []
    for i, c in enumerate(clusters):
        c = np.asarray(c, dtype=np.int64).reshape(-1)
        if len(c) == 0 or c.min() < 0 or c.max() >= n_sensitive:
            raise DataFormatError(
                f"cluster {i} has indices outside the sensitive "
                f"set (0..{n_sensitive - 1}) or is empty."
            )
        out.append(c)
    return out


def _precision(rep: np.ndarray, cands: np.ndarray, is_member: np.ndarray, k: int) -> float:
    """Top-k precision when candidate rows are ranked by cosine similarity to `rep` (stable sort:
    deterministic; members come first in `cands`, so exact ties favour the attacker,
    conservatively)."""
    top = np.argsort(-(cands @ rep), kind="stable")[:k]
    return float(is_member[top].mean())


@dataclass(frozen=True)
class KanonNumbers:
    """compute_kanon_attacks' numbers: cluster-membership precision and re-identification rate."""

    membership: dict[str, Any]  # precision_by_space, attack_precision, chance, cluster sizes, ...
    reid_rate: float
    reid_chance: float
    n_representatives: int
    reidentified_rows: list[int]


def compute_kanon_attacks(
    images: np.ndarray,
    clusters: list[np.ndarray],
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    k: int | None,
    policy: AuditPolicy,
    features: bool = True,
) -> KanonNumbers:
    clusters = _validate_clusters(clusters, len(images), len(sensitive))
    rng = np.random.default_rng(policy.seed)
    reps = sample_idx(len(images), policy.feature_samples, rng)
    use_heldout = heldout is not None and len(heldout) >= max(len(clusters[r]) for r in reps)

    plans = _negative_plans(reps, clusters, sensitive, heldout, use_heldout, rng)
    neg_images = heldout.images if use_heldout and heldout is not None else sensitive.images
    precisions = {
        "pixel": _space_precision(
            plans,
            _pix(images[reps]),
            lambda i: _pix(sensitive.images[i]),
            lambda i: _pix(neg_images[i]),
        )
    }
    if features:
        precisions["feature"] = _feature_precision(
            images[reps], plans, sensitive.images, neg_images, use_heldout
        )
    sizes = np.array([len(c) for c in clusters])
    membership = {
        "n_representatives_attacked": len(reps),
        "precision_by_space": precisions,
        "attack_precision": max(precisions.values()),
        "chance": 0.5,
        "cluster_sizes": {"min": int(sizes.min()), "max": int(sizes.max())},
        "k": k,
        "non_members": "held-out images"
        if use_heldout
        else "sensitive records outside the cluster",
    }
    # re-identification: nearest sensitive record (pixel RMS, whole sensitive set) is a source
    _, nn = rms_nearest(images, sensitive.images)
    hits = np.array([nn[i] in set(clusters[i].tolist()) for i in range(len(images))])
    return KanonNumbers(
        membership,
        float(hits.mean()),
        float(np.mean(sizes) / len(sensitive)),
        len(images),
        np.flatnonzero(hits)[:50].tolist(),
    )


_AttackPlan = tuple[int, np.ndarray, np.ndarray]  # (rep, source indices, negative indices)


def _negative_plans(
    reps: np.ndarray,
    clusters: list[np.ndarray],
    sensitive: ImageDataset,
    heldout: ImageDataset | None,
    use_heldout: bool,
    rng: np.random.Generator,
) -> list[_AttackPlan]:
    """Each attacked representative's sources and as many non-members (held-out images, else
    sensitive records outside its cluster), drawn from `rng` in the representatives' order."""
    plans = []
    for r in reps:
        src = clusters[r]
        if use_heldout and heldout is not None:
            neg = rng.choice(len(heldout), len(src), replace=False)
        else:
            pool = np.setdiff1d(np.arange(len(sensitive)), src)
            neg = rng.choice(pool, min(len(src), len(pool)), replace=False)
        plans.append((r, src, neg))
    return plans


def _space_precision(
    plans: list[_AttackPlan],
    rep_vecs: np.ndarray,
    sens_vec: Callable[[np.ndarray], np.ndarray],
    neg_vec: Callable[[np.ndarray], np.ndarray],
) -> float:
    """The membership attack's mean precision in one space (vectors of representatives, sources
    and non-members)."""
    vals = []
    for j, (_, src, neg) in enumerate(plans):
        cands = np.concatenate([sens_vec(src), neg_vec(neg)])
        member = np.r_[np.ones(len(src)), np.zeros(len(neg))]
        vals.append(_precision(rep_vecs[j], cands, member, len(src)))
    return float(np.mean(vals))


def _pix(x: np.ndarray) -> np.ndarray:
    """Pixel space: centred pixel vectors, unit length (cosine similarity)."""
    f = flat01(x)
    return l2_normalise(f - f.mean(1, keepdims=True))


def _feature_precision(
    rep_images: np.ndarray,
    plans: list[_AttackPlan],
    sensitive_images: np.ndarray,
    neg_images: np.ndarray,
    use_heldout: bool,
) -> float:
    """The attack's precision in feature space, embedding only the images the plans use."""
    used_s = np.unique(
        np.concatenate([p[1] for p in plans] + ([] if use_heldout else [p[2] for p in plans]))
    )
    used_n = np.unique(np.concatenate([p[2] for p in plans])) if use_heldout else used_s
    fs = dict(
        zip(used_s.tolist(), l2_normalise(embed_images(sensitive_images[used_s])), strict=True)
    )
    fn = (
        dict(zip(used_n.tolist(), l2_normalise(embed_images(neg_images[used_n])), strict=True))
        if use_heldout
        else fs
    )
    frep = l2_normalise(embed_images(rep_images))
    return _space_precision(
        plans,
        frep,
        lambda i: np.stack([fs[int(x)] for x in i]),
        lambda i: np.stack([fn[int(x)] for x in i]),
    )


def check_kanon_attacks(n: KanonNumbers, policy: AuditPolicy) -> list[CheckResult]:
    """The audit's two checks on compute_kanon_attacks' numbers, judged against `policy`."""
    best = n.membership["attack_precision"]
    mem = CheckResult(
        "kanon_cluster_membership",
        "attack",
        best <= policy.kanon_max_attack_precision,
        f"cluster-membership attack top-k precision {best:.3f} (best of pixel/feature ranking; "
        f"chance 0.50, max {policy.kanon_max_attack_precision})",
        n.membership,
    )
    reid = CheckResult(
        "kanon_reidentification",
        "attack",
        n.reid_rate <= policy.kanon_max_reid_rate,
        f"re-identification: nearest record is a source for {n.reid_rate:.3f} of representatives "
        f"(chance {n.reid_chance:.4f}, max {policy.kanon_max_reid_rate})",
        {
            "reid_rate": n.reid_rate,
            "chance": n.reid_chance,
            "n_representatives": n.n_representatives,
            "space": "pixel RMS",
            "reidentified_rows": n.reidentified_rows,
        },
    )
    return [mem, reid]
