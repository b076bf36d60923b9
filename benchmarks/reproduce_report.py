"""REPRODUCTION.md from the results dict of `make reproduce`: tables, paper-ordering checks, plots."""
from __future__ import annotations

import math
from typing import Any

from benchmarks.common import md_table

PAPER_PRIVIMAGE = ("PrivImage", "PDP-Diffusion-style (all public)", "DPDM-style (no pre-training)")
KSAME = ("k-Same-Pixel", "k-Same-PCA", "k-Centroid")
FID_NAME = "FID (EfficientNet-Lite0 features; not comparable with Inception FID)"


def _f(x: float | None, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{nd}f}"


def _acc(a: dict[str, float]) -> list[str]:
    return [_f(a["logreg"]), _f(a["mlp"]), _f(a["cnn"])]


def privimage_orderings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per epsilon: does ours follow the paper's PrivImage > PDP-Diffusion > DPDM (FID lower, CNN acc higher)?"""
    out = []
    for eps in sorted({r["epsilon"] for r in rows}):
        by = {r["method"]: r for r in rows if r["epsilon"] == eps}
        if not all(m in by for m in PAPER_PRIVIMAGE):
            continue
        fids = [by[m]["fid"] for m in PAPER_PRIVIMAGE]
        accs = [by[m]["acc"]["cnn"] for m in PAPER_PRIVIMAGE]
        out.append({"epsilon": eps, "fid_agrees": fids[0] < fids[1] < fids[2],
                    "acc_agrees": accs[0] > accs[1] > accs[2],
                    "fid_order": " < ".join(m.split(" ")[0] for _, m in sorted(zip(fids, PAPER_PRIVIMAGE))),
                    "acc_order": " > ".join(m.split(" ")[0] for _, m in sorted(zip(accs, PAPER_PRIVIMAGE),
                                                                               reverse=True))})
    return out


def ksalsa_orderings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per k: k-SALSA FID below every k-Same baseline; k-SALSA attack precision below k-Same-Pixel's."""
    out = []
    for k in sorted({r["k"] for r in rows}):
        by = {r["method"]: r for r in rows if r["k"] == k}
        if "k-SALSA" not in by or not all(m in by for m in KSAME):
            continue
        ks = by["k-SALSA"]
        out.append({"k": k, "fid_agrees": all(ks["fid"] < by[m]["fid"] for m in KSAME),
                    "fid_beaten_by": [m for m in KSAME if by[m]["fid"] <= ks["fid"]],
                    "attack_agrees": ks["attack"] < by["k-Same-Pixel"]["attack"],
                    "attack": ks["attack"], "attack_pixel": by["k-Same-Pixel"]["attack"]})
    return out


def _yes(b: bool) -> str:
    return "agrees" if b else "**disagrees**"


def privimage_section(r: dict[str, Any], s: dict[str, Any], plots: dict[str, str]) -> str:
    pi = s["privimage"]
    L = ["## 1. PrivImage (paper Table 3 / Figure 5 shape)", ""]
    L.append(f"Sensitive: builtin:mnist5k ({r['n_sensitive']} images, 10 classes); public pool: {r['public']} "
             f"({r['n_public']} images, {r['public_classes']} classes"
             f"{'' if r['fashion_installed'] else '; Fashion-MNIST NOT installed, digits only'}); test: "
             f"builtin:mnist5k-heldout ({r['n_test']} real images). delta = {s['delta']:g}. Device: {r['device']}. "
             f"Time: {r['seconds'] / 60:.1f} min for this section (audit included).")
    L.append(f"Settings: {pi}; query_sigma = {s['query_sigma']}; k = 1 (with 10 sensitive classes and 20 public "
             "classes, k >= 2 selects 10 x k >= 20 classes, i.e. the whole pool: selection ratio 1.0 and PrivImage "
             f"would equal the PDP-Diffusion-style baseline). Downstream classifiers: audit.utility (LR, MLP (128), "
             f"small CNN, {s['cnn_epochs']} epochs) trained on the {pi['n_samples']} synthetic images, tested on the "
             f"real held-out set. {FID_NAME}: {pi['n_samples']} synthetic vs the {r['n_sensitive']} sensitive images.")
    L.append("Baselines: DPDM-style = the same UNet and DP-SGD without pre-training; PDP-Diffusion-style = "
             "unconditional pre-training on the whole public pool, then the same DP-SGD. The noise multiplier is "
             "calibrated so that the whole history (semantic query + DP-SGD) stays within epsilon.")
    L.append("")
    rows = [["real data (non-private upper bound)", "-", _f(r["real"]["fid_heldout"], 2) + " (real held-out)",
             *_acc(r["real"]["acc"]), "-", "-", "-", "-"]]
    npd = r["nonprivate_diffusion"]
    rows.append([f"same UNet, no DP (eps = inf, {npd['train_steps']} steps on sensitive)", "inf", _f(npd["fid"], 2),
                 *_acc(npd["acc"]), "-", "-", "-", _f(npd["train_seconds"], 0)])
    for x in r["rows"]:
        ratio = "-" if x["selection_ratio"] is None else f"{x['selection_ratio']:.2f}"
        rows.append([x["method"], f"{x['epsilon']:g}", _f(x["fid"], 2), *_acc(x["acc"]),
                     f"{x['eps_rdp']:.3f} / {x['eps_pld']:.3f}", f"{x['noise_multiplier']:.3f}", ratio,
                     _f(x["seconds_run"], 0)])
    L.append(md_table(["method", "epsilon", "FID", "acc LR", "acc MLP", "acc CNN", "spent eps RDP / PLD",
                       "noise mult.", "selection ratio", "run s"], rows))
    L.append("")
    L.append("Selected public classes (PrivImage, sensitive class -> chosen public class):")
    L.append("")
    for x in r["rows"]:
        if x["selected"]:
            L.append(f"- epsilon {x['epsilon']:g}: " + "; ".join(f"{k} -> {', '.join(v)}" for k, v in
                                                                 x["selected"].items()))
    L.append("")
    for p in plots.get("privimage", []):
        L.append(f"![{p}](reproduction/{p})")
    L.append("")
    grids = [g for g in plots.get("grids", []) if g.startswith("privimage_")]
    if grids:
        L.append(f"Samples at epsilon {max(s['epsilons']):g} (and of the non-private model), 2 per class:")
        L.append("")
        L += [f"![{g}](reproduction/{g})" for g in grids]
        L.append("")
    L.append("### Comparison with the paper")
    L.append("")
    L.append("Paper ordering at every epsilon: PrivImage better than PDP-Diffusion better than DPDM, in FID and in "
             "downstream accuracy.")
    L.append("")
    orders = privimage_orderings(r["rows"])
    L.append(md_table(["epsilon", "our FID order (best first)", "FID vs paper", "our CNN-accuracy order",
                       "accuracy vs paper"],
                      [[f"{o['epsilon']:g}", o["fid_order"], _yes(o["fid_agrees"]), o["acc_order"],
                        _yes(o["acc_agrees"])] for o in orders]))
    L.append("")
    if not all(o["fid_agrees"] and o["acc_agrees"] for o in orders):
        L.append("Where we disagree, the likely reasons: (1) scale: a UNet of a few hundred thousand parameters, "
                 "28 px greyscale and a few DP-SGD epochs on CPU, against the paper's large UNets trained for "
                 "hundreds of epochs on GPUs; at this size all three methods are limited by under-training rather "
                 "than by the pre-training data; (2) the public pool is tiny (1,797 UCI digits, upsampled from 8x8, "
                 "plus "
                 "Fashion-MNIST) instead of ImageNet: pre-training on the selected UCI digits gives a prior whose "
                 "stroke style differs from MNIST, and pre-training on everything (PDP-Diffusion-style) is then "
                 "mostly Fashion-MNIST, so the gap between the two pre-trainings is driven by a few hundred "
                 "low-resolution digits; (3) the semantic query spends part of the budget (PrivImage's DP-SGD runs "
                 "with a slightly larger noise multiplier than the baselines at the same epsilon); (4) one repeat: "
                 "the DP noise is drawn from OS entropy by design, and differences of a few points are within the "
                 "run-to-run spread; (5) our FID uses EfficientNet-Lite0 features at 64 px, not Inception, on "
                 f"{pi['n_samples']} samples (small-sample FID is biased upwards).")
    else:
        L.append("Our ordering matches the paper's at every epsilon (one repeat; see the caveats in the notes).")
    L.append("")
    return "\n".join(L)


def audit_section(r: dict[str, Any], s: dict[str, Any], plots: dict[str, str]) -> str:
    L = ["## 3. Privacy audit of the PrivImage models", ""]
    L.append(f"Loss-threshold membership inference (audit.mia.attack_stats on "
             f"synth.privimage.per_sample_diffusion_loss, 5 timesteps x 2 fixed noise draws): {s['mia_samples']} "
             "members (sensitive training images) vs as many non-members (builtin:mnist5k-heldout). Empirical epsilon "
             "lower bound: audit.epsilon_bound (threshold chosen on one half, Clopper-Pearson 95% on the other, "
             f"delta = {s['delta']:g}). eps = inf: the same UNet trained without DP for {s['nonprivate_steps']} steps "
             f"(batch {s['nonprivate_batch']}) on the sensitive set, no public pre-training.")
    L.append("")
    rows = [["inf (no DP)" if math.isinf(a["epsilon"]) else f"{a['epsilon']:g}", a["n"], _f(a["auc"]),
             _f(a["tpr_at_1pct_fpr"]), "0.010", _f(a["eps_lower"]), _f(a["eps_point"]), _f(a["seconds"], 0)]
            for a in r["audit"]]
    L.append(md_table(["claimed epsilon", "members / non-members each", "AUC", "TPR at 1% FPR", "chance TPR",
                       "empirical eps lower bound (95%)", "eps point estimate", "seconds"], rows))
    L.append("")
    bad = [a for a in r["audit"] if not math.isinf(a["epsilon"]) and a["eps_lower"] > a["epsilon"]]
    L.append("No empirical lower bound exceeds the claimed epsilon." if not bad else
             "**An empirical lower bound exceeds its claimed epsilon: the accounting or the training is wrong.**")
    L.append("The paper does not report an audit; the expectation is that DP models stay near chance and the "
             "non-private model leaks more. A loss-threshold attack with a few hundred samples is weak: it can only "
             "certify small lower bounds (with n per side, the best certifiable epsilon is about log(n)), so a "
             "near-chance result for the non-private model says the model did not memorise at this training "
             "length, not that it is private.")
    L.append("")
    if plots.get("audit"):
        L.append(f"![{plots['audit']}](reproduction/{plots['audit']})")
        L.append("")
    return "\n".join(L)


def ksalsa_section(r: dict[str, Any], s: dict[str, Any], plots: dict[str, str]) -> str:
    L = ["## 2. k-SALSA (paper Tables 1-3 shape)", ""]
    L.append(f"Sensitive: {r['n_sensitive']} builtin:mnist5k images ({s['ksalsa_per_class']} per class); codec "
             f"trained on the public pool {r['public']} ({r['n_public']} images): {r['codec']} "
             f"({r['codec_seconds']:.0f} "
             f"s). k-SALSA settings: {r['config']}. Device: {r['device']}. Time: {r['seconds'] / 60:.1f} min.")
    L.append(f"Metrics: {FID_NAME} of the released images against the sensitive images (fewer released images at "
             "larger k bias FID upwards); LR / MLP / CNN trained on the released images with their majority labels, "
             "tested on the real held-out set; cluster-membership attack (audit.kanon_attacks: rank the k sources "
             "and k "
             "held-out non-members by similarity to the representative, pixel and EfficientNet-feature space, best of "
             "the two, top-k precision, chance 0.5); re-identification = nearest sensitive record is a source. "
             "Ablation: k-SALSA with grid = 1 (one patch per map: global Gram matrices, no local alignment).")
    L.append("")
    rec = r["reconstruction"]
    ra = r["real_acc"]
    rows = [["real sensitive images (reference)", "-", "-", "-", *_acc(ra), "-", "-", "-"],
            ["codec reconstruction (paper's GAN-inverted row)", "1", f"{r['n_sensitive']} / 0",
             _f(rec["fid"], 2), *_acc(rec["acc"]), _f(rec["attack"]), _f(rec["reid"]), "-"]]
    for x in r["rows"]:
        rows.append([x["method"], x["k"], f"{x['released']} / {x['dropped']}", _f(x["fid"], 2), *_acc(x["acc"]),
                     _f(x["attack"]), _f(x["reid"]), _f(x["seconds"], 1)])
    L.append(md_table(["method", "k", "released / dropped", "FID", "acc LR", "acc MLP", "acc CNN",
                       "membership attack", "re-id rate", "averaging s"], rows))
    L.append("")
    if plots.get("ksalsa"):
        L.append(f"![{plots['ksalsa']}](reproduction/{plots['ksalsa']})")
        L.append("")
    grids = [g for g in plots.get("grids", []) if g.startswith("ksalsa_")]
    if grids:
        L.append("Released images at k = 5 (2 per majority label) and codec reconstructions:")
        L.append("")
        L += [f"![{g}](reproduction/{g})" for g in grids]
        L.append("")
    L.append("### Comparison with the paper")
    L.append("")
    L.append("Paper: k-SALSA has better (lower) FID than the k-Same baselines and a lower cluster-membership attack "
             "accuracy than k-Same-Pixel.")
    L.append("")
    orders = ksalsa_orderings(r["rows"])
    L.append(md_table(["k", "k-SALSA FID below all k-Same baselines", "baselines at least as good",
                       "k-SALSA attack vs k-Same-Pixel", "attack vs paper"],
                      [[o["k"], _yes(o["fid_agrees"]), ", ".join(o["fid_beaten_by"]) or "-",
                        f"{o['attack']:.3f} vs {o['attack_pixel']:.3f}", _yes(o["attack_agrees"])] for o in orders]))
    L.append("")
    if not all(o["fid_agrees"] and o["attack_agrees"] for o in orders):
        L.append("Where we disagree, the likely reasons: the paper's generator is a StyleGAN2 inverted with "
                 "e4e/pSp on 256-1024 px fundus photos, where pixel averages are visibly blurred and style is what "
                 "a CNN sees; here the codec is a small conv autoencoder trained on public digits and clothes at "
                 "28 px, whose decoder cannot produce the sharpness a pretrained GAN has, and MNIST digits are "
                 "nearly binary strokes on a black background, so the pixel mean of k aligned-by-clustering digits is "
                 "already close to a digit. The style/content CNN (EfficientNet-Lite0, ImageNet) sees 28 px digits "
                 "upsampled, far from its training distribution, and k-SALSA runs only a few optimisation steps on "
                 "CPU. The attack compares pixel and feature similarity; k-SALSA's images are pulled towards the "
                 "members' local styles, which can make them closer to their sources in feature space than a "
                 "blurry pixel mean is.")
    else:
        L.append("Our orderings match the paper's at every k (one repeat).")
    L.append("")
    return "\n".join(L)
