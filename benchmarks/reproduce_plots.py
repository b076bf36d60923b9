"""PNG plots of `make reproduce` (matplotlib, Agg backend): curves from the results dict and image grids."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.reproduce_report import mean_rows  # noqa: E402

CLASSIFIERS = (("logreg", "LR"), ("mlp", "MLP"), ("cnn", "CNN"))


def _save(fig, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path.name


def image_grid(
    path: Path, images: np.ndarray, labels: np.ndarray, title: str, per_class: int = 2
) -> str:
    """Up to `per_class` images of each label, one column per label."""
    classes = sorted(np.unique(labels).tolist())
    fig, axes = plt.subplots(
        per_class, len(classes), figsize=(0.8 * len(classes), 0.8 * per_class + 0.4), squeeze=False
    )
    for j, c in enumerate(classes):
        idx = np.flatnonzero(labels == c)[:per_class]
        for i in range(per_class):
            ax = axes[i, j]
            ax.axis("off")
            if i < len(idx):
                ax.imshow(images[idx[i]], cmap="gray", vmin=0, vmax=255)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def privimage_curves(res: dict[str, Any], out_dir: Path) -> list[str]:
    rows = mean_rows(
        res["rows"]
    )  # several runs of a setting: their mean, with bars from min to max
    methods = list(dict.fromkeys(r["method"] for r in rows))
    files = []
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (key, label) in zip(axes, CLASSIFIERS):
        for m in methods:
            rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["epsilon"])
            mean = np.array([r["acc"][key] for r in rs])
            bars = [mean - [r["acc_min"][key] for r in rs], [r["acc_max"][key] for r in rs] - mean]
            ax.errorbar([r["epsilon"] for r in rs], mean, yerr=bars, fmt="o-", capsize=3, label=m)
        ax.axhline(
            res["real"]["acc"][key], color="k", ls="--", lw=0.8, label="real data (non-private)"
        )
        (
            ax.set_xlabel("epsilon"),
            ax.set_ylabel(f"{label} accuracy on real held-out"),
            ax.set_title(label),
        )
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7)
    files.append(_save(fig, out_dir / "privimage_accuracy_vs_epsilon.png"))
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for m in methods:
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["epsilon"])
        ax.plot([r["epsilon"] for r in rs], [r["fid"] for r in rs], "o-", label=m)
    ax.axhline(
        res["real"]["fid_heldout"], color="k", ls="--", lw=0.8, label="real held-out (floor)"
    )
    (
        ax.set_xlabel("epsilon"),
        ax.set_ylabel("FID (EfficientNet-Lite0 features)"),
        ax.set_yscale("log"),
    )
    ax.legend(fontsize=7)
    files.append(_save(fig, out_dir / "privimage_fid_vs_epsilon.png"))
    return files


def ksalsa_curves(res: dict[str, Any], out_dir: Path) -> str:
    rows = res["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    panels = (
        ("fid", "FID (EfficientNet-Lite0), lower = closer"),
        ("cnn", "CNN accuracy on real held-out"),
        ("attack", "cluster-membership attack precision"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (key, label) in zip(axes, panels):
        for m in methods:
            rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["k"])
            ys = [r["acc"]["cnn"] if key == "cnn" else r[key] for r in rs]
            ax.plot([r["k"] for r in rs], ys, "o-", label=m)
        rec = res["reconstruction"]
        ref = rec["acc"]["cnn"] if key == "cnn" else rec[key]
        ax.axhline(ref, color="k", ls="--", lw=0.8, label="codec reconstruction (no anonymity)")
        if key == "attack":
            ax.axhline(0.5, color="grey", ls=":", lw=0.8, label="chance")
        ax.set_xlabel("k"), ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=6)
    return _save(fig, out_dir / "ksalsa_vs_k.png")


def audit_roc(audit: list[dict[str, Any]], out_dir: Path) -> str:
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for a in audit:
        eps = "inf (no DP)" if math.isinf(a["epsilon"]) else f"{a['epsilon']:g}"
        ax.plot(
            np.maximum(a["roc"]["fpr"], 1e-4),
            np.maximum(a["roc"]["tpr"], 1e-4),
            label=f"eps {eps} (AUC {a['auc']:.3f})",
        )
    ax.plot([1e-4, 1], [1e-4, 1], "k--", lw=0.8, label="chance")
    ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlim(1e-3, 1), ax.set_ylim(1e-3, 1)
    ax.set_xlabel("false positive rate"), ax.set_ylabel("true positive rate"), ax.legend(fontsize=7)
    ax.set_title("Loss-threshold MIA on the PrivImage UNet", fontsize=9)
    return _save(fig, out_dir / "audit_mia_roc.png")


SCORE_NAMES = {"model": "final-model score", "gradients": "gradient (white-box) score"}


def one_run_scores(rows: list[dict[str, Any]], out_dir: Path) -> str:
    """Canary score distributions (included vs excluded) of the one-run audit: one column per
    epsilon,
    one row per score, the lower bound beside the charged epsilon in each title."""
    kinds = list(rows[0]["scores"])
    fig, axes = plt.subplots(
        len(kinds), len(rows), figsize=(3.6 * len(rows), 2.9 * len(kinds)), squeeze=False
    )
    for i, kind in enumerate(kinds):
        for ax, a in zip(axes[i], rows):
            sc = a["scores"][kind]
            _score_hist(ax, np.asarray(sc["scores_in"]), np.asarray(sc["scores_out"]))
            claim = "inf (noise off)" if math.isinf(a["epsilon"]) else f"{a['claimed_epsilon']:.2f}"
            ax.set_title(
                f"eps {'inf' if math.isinf(a['epsilon']) else format(a['epsilon'], 'g')}: bound "
                f"{sc['eps_lower']:.2f} vs charged {claim}",
                fontsize=8,
            )
            ax.set_xlabel(SCORE_NAMES.get(kind, kind), fontsize=7)
            ax.tick_params(labelsize=6)
        axes[i][0].set_ylabel("canaries", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"One-run audit of DP-SGD (Steinke et al. 2023), {rows[0]['canaries']} canaries: included vs "
        f"excluded (ceiling {rows[0]['max_certifiable']:.2f})",
        fontsize=9,
    )
    return _save(fig, out_dir / "audit_one_run_scores.png")


def _score_hist(ax, s_in: np.ndarray, s_out: np.ndarray) -> None:
    """Histograms on a common axis; a score with a huge outlying cluster (no noise) is drawn by rank
    of
    magnitude (sign * log10(1 + |x|)) so both clusters stay visible."""
    both = np.r_[s_in, s_out]
    if np.ptp(both) > 1e4 * (np.std(s_out) + 1e-300):
        s_in, s_out = (np.sign(v) * np.log10(1 + np.abs(v)) for v in (s_in, s_out))
        ax.text(
            0.5, 0.92, "sign * log10(1 + |score|)", transform=ax.transAxes, ha="center", fontsize=6
        )
        both = np.r_[s_in, s_out]
    bins = np.linspace(both.min(), both.max(), 40) if both.max() > both.min() else 10
    ax.hist(s_out, bins=bins, alpha=0.6, label=f"excluded ({len(s_out)})")
    ax.hist(s_in, bins=bins, alpha=0.6, label=f"included ({len(s_in)})")
