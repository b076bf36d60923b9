"""Fast checks of `make reproduce`'s report writing on toy numbers (no training)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

# opacus installs its own top-level `benchmarks` package into site-packages; make ours win.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
for _name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
    if "site-packages" in str(getattr(sys.modules[_name], "__file__", "")):
        del sys.modules[_name]

from benchmarks.reproduce import _jsonable, _unjson, build_report, write_plots  # noqa: E402
from benchmarks.reproduce_report import (
    ksalsa_orderings,
    matching_digit_classes,
    mean_rows,  # noqa: E402
    privimage_orderings,
    privimage_spread,
)
from benchmarks.reproduce_settings import AUDIT_EPSILONS, EPSILONS, KS, settings  # noqa: E402

METHODS = ("PrivImage", "DPDM-style (no pre-training)", "PDP-Diffusion-style (all public)")


def _acc(v: float) -> dict:
    return {"logreg": v, "mlp": v + 0.01, "cnn": v + 0.02}


def _toy_results(paper_order: bool) -> dict:
    s = {
        **settings("micro"),
        "epsilons": list(EPSILONS),
        "audit_epsilons": list(AUDIT_EPSILONS),
        "ks": list(KS),
    }
    rows = []
    for eps in EPSILONS:
        for i, m in enumerate(METHODS):
            # paper order: PrivImage best, then PDP (index 2), then DPDM (index 1)
            rank = {0: 0, 2: 1, 1: 2}[i] if paper_order else i
            # PrivImage runs three times, 0.8 +- 0.01 around its rank's accuracy (its mean keeps the order)
            for run, jitter in enumerate((0.0, -0.01, 0.01) if i == 0 else (0.0,), start=1):
                rows.append(
                    {
                        "epsilon": eps,
                        "method": m,
                        "fid": 100.0 + 10 * rank - eps,
                        "acc": _acc(0.8 - 0.1 * rank + jitter),
                        "eps_rdp": eps * 0.99,
                        "eps_pld": eps * 0.9,
                        "noise_multiplier": 1.0,
                        "steps": 10,
                        "run": run,
                        "selection_ratio": 0.5 if i == 0 else (1.0 if i == 2 else None),
                        "selected": {"0": ["digit 0"]} if i == 0 else None,
                        "seconds_run": 1.0,
                    }
                )
    roc = {"fpr": [0.0, 0.01, 1.0], "tpr": [0.0, 0.02, 1.0]}
    audit = [
        {
            "epsilon": e,
            "n": 10,
            "auc": 0.5,
            "tpr_at_1pct_fpr": 0.02,
            "eps_lower": 0.0,
            "eps_point": 0.1,
            "roc": roc,
            "seconds": 1.0,
        }
        for e in (*AUDIT_EPSILONS, math.inf)
    ]
    privimage = {
        "device": "cpu",
        "n_sensitive": 4000,
        "n_test": 1000,
        "public": "pool",
        "n_public": 100,
        "public_classes": 20,
        "fashion_installed": True,
        "rows": rows,
        "audit": audit,
        "real": {"acc": _acc(0.9), "fid_heldout": 5.0, "seconds": 1.0},
        "nonprivate_diffusion": {
            "fid": 50.0,
            "acc": _acc(0.85),
            "train_steps": 5,
            "train_seconds": 1.0,
        },
        "seconds": 60.0,
    }
    krows = []
    for k in KS:
        for j, m in enumerate(("k-Same-Pixel", "k-Same-PCA", "k-Centroid", "k-SALSA")):
            good = (m == "k-SALSA") == paper_order
            krows.append(
                {
                    "k": k,
                    "method": m,
                    "released": 100 // k,
                    "dropped": 0,
                    "seconds": 0.1,
                    "seconds_clustering": 0.1,
                    "fid": 10.0 if good else 20.0 + j,
                    "acc": _acc(0.7),
                    "attack": 0.6 if good else 0.9,
                    "attack_by_space": {},
                    "reid": 0.5,
                    "reid_chance": 0.01,
                }
            )
    ksalsa = {
        "device": "cpu",
        "n_sensitive": 100,
        "n_test": 1000,
        "public": "pool",
        "n_public": 100,
        "codec": "AE",
        "codec_seconds": 1.0,
        "config": {"k": 2},
        "rows": krows,
        "seconds": 30.0,
        "real_acc": _acc(0.9),
        "reconstruction": {
            "fid": 3.0,
            "acc": _acc(0.88),
            "attack": 1.0,
            "reid": 0.95,
            "mse_pm1": 0.01,
        },
    }
    return {
        "settings": s,
        "machine": "toy machine",
        "date": "today",
        "threads": 1,
        "errors": {},
        "privimage": privimage,
        "ksalsa": ksalsa,
        "seconds": 90.0,
    }


@pytest.fixture(scope="module")
def paper_order_plots(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The plots of the paper-order toy results (no grids), drawn once for the tests that render a
    report from them (matplotlib: about a second each time)."""
    return write_plots(_toy_results(paper_order=True), tmp_path_factory.mktemp("plots"), [])


@pytest.mark.parametrize("paper_order", [True, False])
def test_orderings_detect_agreement_and_disagreement(paper_order: bool) -> None:
    res = _toy_results(paper_order)
    pi = privimage_orderings(res["privimage"]["rows"])
    ks = ksalsa_orderings(res["ksalsa"]["rows"])
    assert len(pi) == len(EPSILONS) and len(ks) == len(KS)
    assert all(
        o["fid_agrees"] == o["acc_agrees"] == o["mean_acc_agrees"] == paper_order for o in pi
    )
    expected = (
        ("PrivImage", "PDP-Diffusion-style", "DPDM-style")
        if paper_order
        else ("PrivImage", "DPDM-style", "PDP-Diffusion-style")
    )
    assert all(
        o["fid_order"] == " < ".join(expected) and o["mean_acc_order"] == " > ".join(expected)
        for o in pi
    )
    assert all(o["fid_agrees"] == paper_order and o["attack_agrees"] == paper_order for o in ks)


def test_report_and_plots_written(tmp_path) -> None:
    res = _toy_results(paper_order=False)
    from benchmarks.reproduce_plots import image_grid

    rng = np.random.default_rng(0)
    g = image_grid(
        tmp_path / "privimage_toy_grid.png",
        rng.integers(0, 255, (20, 28, 28), dtype=np.uint8),
        np.repeat(np.arange(10), 2),
        "toy",
    )
    plots = write_plots(res, tmp_path, [g])
    for name in (*plots["privimage"], plots["audit"], plots["ksalsa"], g):
        assert (tmp_path / name).stat().st_size > 1000
    md = build_report(res, plots)
    assert "**disagrees**" in md and "MICRO smoke run" in md
    assert "inf (no DP)" in md and "codec reconstruction" in md
    for name in (*plots["privimage"], plots["ksalsa"], plots["audit"], g):
        assert f"(reproduction/{name})" in md
    agree = build_report(_toy_results(paper_order=True), plots)
    assert "**disagrees**" not in agree


def test_privimage_runs_are_summarised_by_mean_and_spread(paper_order_plots: dict) -> None:
    rows = _toy_results(paper_order=True)["privimage"]["rows"]
    means = mean_rows(rows)
    assert len(means) == 3 * len(EPSILONS) and {m["runs"] for m in means} == {1, 3}
    ours = privimage_spread(rows)
    assert [x["epsilon"] for x in ours] == sorted(EPSILONS) and all(x["runs"] == 3 for x in ours)
    assert ours[0]["acc"]["cnn"] == pytest.approx(0.82) and ours[0]["acc_min"][
        "cnn"
    ] == pytest.approx(0.81)
    assert ours[0]["acc_std"]["cnn"] == pytest.approx(0.01)
    # equal means at every epsilon: neither a rise beyond the spread nor a fall
    assert ours[0]["rises"] is None and not any(x["rises"] or x["falls"] for x in ours[1:])
    rising = [
        {**r, "acc": _acc(r["acc"]["logreg"] + 0.05 * i)}
        for r in rows
        for i in [EPSILONS.index(r["epsilon"])]
    ]
    assert all(x["rises"] for x in privimage_spread(rising)[1:])
    falling = [
        {**r, "acc": _acc(r["acc"]["logreg"] - 0.05 * i)}
        for r in rows
        for i in [EPSILONS.index(r["epsilon"])]
    ]
    assert all(x["falls"] for x in privimage_spread(falling)[1:])
    md = build_report(_toy_results(paper_order=True), paper_order_plots)
    assert "PrivImage over its runs" in md and "PrivImage (run 3)" in md and "0.810-0.830" in md


@pytest.mark.slow  # end to end, about a minute on 2 cores (CI runs the slow tests too)
def test_vote_settings_fit_every_reproduced_epsilon() -> None:
    """The reproduction's per-epsilon vote is accepted by the planner and charged within epsilon, and the
    one-run audit audits the DP-SGD of exactly that plan."""
    from benchmarks.reproduce_settings import privimage_config, vote_settings
    from synth.mechanisms.privimage.plan import plan_privimage

    for mode in ("micro", "cpu", "full"):
        s = settings(mode)
        for eps in EPSILONS:
            cfg = privimage_config(s, eps)
            expected = vote_settings(eps) | ({"vote_pool": 2} if mode == "micro" else {})
            assert {k: getattr(cfg, k) for k in expected} == expected
            plan = plan_privimage(cfg, 4000, n_classes=10)
            assert plan.vote_event is not None and plan.epsilon.epsilon_rdp <= eps + 1e-9
    low, mid, high = vote_settings(1.0), vote_settings(5.0), vote_settings(10.0)
    assert low["vote_sigma"] > high["vote_sigma"] and low["vote_rounds"] < high["vote_rounds"]
    assert (
        mid["vote_pool"] == 4 < high["vote_pool"]
    )  # eight candidates only where the vote noise is low


def test_results_json_roundtrip_keeps_infinity() -> None:
    res = _toy_results(paper_order=True)
    import json

    back = _unjson(json.loads(json.dumps(_jsonable(res))))
    assert math.isinf(back["privimage"]["audit"][-1]["epsilon"])
    assert back["privimage"]["rows"][0]["fid"] == res["privimage"]["rows"][0]["fid"]


def test_report_only_renders_the_same_report_as_the_run(paper_order_plots: dict) -> None:
    """`--report-only` re-reads results.json, where tuples (the UNet's channels) come back as lists."""
    import json

    res = _toy_results(paper_order=True)
    back = _unjson(json.loads(json.dumps(_jsonable(res))))
    assert build_report(back, paper_order_plots) == build_report(res, paper_order_plots)


def test_matching_digit_classes_counts_semantically_right_choices() -> None:
    chosen = {"0": ["digit 0"], "1": ["Trouser"], "2": ["digit 3", "digit 2"], "3": ["digit 8"]}
    assert matching_digit_classes(chosen) == 2


def _toy_one_run(rng: np.random.Generator) -> dict:
    rows = []
    for e, c, lb, shift in (
        (1.0, 0.98, 0.0, 0.1),
        (10.0, 9.997, 0.8, 1.0),
        (math.inf, math.inf, 5.19, 1e12),
    ):
        scores = {
            k: {
                "eps_lower": lb,
                "correct": 90,
                "guesses": 100,
                "gaussian_eps_lower": lb,
                "seconds": 1.5,
                "scores_in": (rng.normal(shift, 1, 100)).tolist(),
                "scores_out": rng.normal(0, 1, 100).tolist(),
            }
            for k in ("model", "gradients")
        }
        rows.append(
            {
                "epsilon": e,
                "claimed_epsilon": c,
                "sample_rate": 0.05,
                "noise_multiplier": 2.0,
                "steps": 80,
                "canaries": 200,
                "max_certifiable": 5.19,
                "scores": scores,
            }
        )
    return {
        "rows": rows,
        "public": "pool",
        "n_public": 100,
        "seconds": 9.0,
        "date": "d",
        "machine": "m",
        "mode": "micro",
    }


def test_one_run_audit_separation_plot_and_table(tmp_path) -> None:
    res = _toy_results(paper_order=True)
    res["audit"] = _toy_one_run(np.random.default_rng(0))
    plots = write_plots(res, tmp_path, [])
    assert (tmp_path / plots["one_run"]).stat().st_size > 1000
    md = build_report(res, plots)
    assert "3a. One-run audit of the DP-SGD implementation" in md and "inf (noise off)" in md
    assert f"(reproduction/{plots['one_run']})" in md and "| 5.19 |" in md
    assert (
        "No lower bound exceeds its charged epsilon" in md
        and "100% of the included canaries score above" in md
    )
    assert "cannot prove that epsilon 10.00 is exceeded" in md  # charged 9.997 > ceiling 5.19
    assert "no canary count lifts it past 6.1 at delta 1e-05" in md
    assert (
        "3b. Membership inference" in md
        and "cannot tell a private model from a non-private one" in md
    )
    res["audit"]["rows"][0]["scores"]["gradients"]["eps_lower"] = 1.5  # above the charged 0.98
    assert "leaks more than it charges" in build_report(res, plots)


# Slow since issue 63 (end to end: a whole audit section; fast:
# test_report_only_renders_the_same_report_as_the_run,
# test_one_run_audit_separation_plot_and_table)
@pytest.mark.slow
def test_only_audit_rewrites_just_its_section(tmp_path) -> None:
    """`--only audit` (a real micro-sized audit, seconds) keeps sections 1-2 and the header as they are in
    the file, replaces section 3, and its numbers show the separation: noise off at the ceiling, the honest
    runs below their charge."""
    import json

    from benchmarks import reproduce

    res = _toy_results(paper_order=True)
    out = tmp_path / "REPRODUCTION.md"
    (tmp_path / "reproduction").mkdir()
    (tmp_path / "reproduction" / "results.json").write_text(json.dumps(_jsonable(res)))
    reproduce.write_report(res, out, [])
    edited = out.read_text().replace("## 1. PrivImage", "HAND-EDITED LINE\n\n## 1. PrivImage")
    out.write_text(edited)
    reproduce.main(["--micro", "--only", "audit", "--out", str(out)])
    text = out.read_text()
    assert text.startswith(edited[: edited.index("## 3. ")]) and "HAND-EDITED LINE" in text
    assert (
        "3a. One-run audit" in text
        and text.count("## 3. ") == 1
        and "## Settings of the other modes" in text
    )
    assert (tmp_path / "reproduction" / "audit_one_run_scores.png").stat().st_size > 1000
    saved = _unjson(json.loads((tmp_path / "reproduction" / "results.json").read_text()))
    assert saved["date"] == res["date"] and "privimage" in saved
    rows = saved["audit"]["rows"]
    assert [r["epsilon"] for r in rows] == [*AUDIT_EPSILONS, math.inf] and set(
        rows[0]["scores"]
    ) == {"model", "gradients"}
    assert rows[2]["scores"]["gradients"]["eps_lower"] > 0.9 * rows[2]["max_certifiable"]
    assert all(
        r["scores"][k]["eps_lower"] < r["claimed_epsilon"] for r in rows[:2] for k in r["scores"]
    )


def test_audit_settings_are_the_privimage_runs_plans() -> None:
    from benchmarks.reproduce_audit import audit_settings
    from synth.mechanisms.privimage import PrivImageConfig
    from synth.mechanisms.privimage.plan import plan_privimage

    s = {**settings("cpu"), "audit_epsilons": [1.0, 10.0]}
    sets = audit_settings(s)
    plan = plan_privimage(
        PrivImageConfig(
            epsilon=1.0,
            delta=s["delta"],
            query_sigma=s["query_sigma"],
            **s["privimage"],
            **s["vote"]["1"],
        ),
        4000,
        n_classes=10,
    )
    assert (sets[0][1].sample_rate, sets[0][1].noise_multiplier, sets[0][1].steps) == (
        plan.sample_rate,
        plan.noise_multiplier,
        plan.steps,
    )
    assert (
        sets[0][1].noise_multiplier > sets[1][1].noise_multiplier
        and sets[0][1].claimed_epsilon < 1.0
    )


def test_throwaway_ledger_admits_the_run_it_is_made_for(tmp_path) -> None:
    """Regression: with cap = epsilon the ledger's privacy filter refused every reproduction run (its stop rule
    is stricter than the fixed-sequence RDP epsilon the plan is calibrated to), so `make reproduce` failed."""
    from accounting import ledger
    from benchmarks.common import throwaway_store
    from benchmarks.reproduce_settings import privimage_config
    from synth.kinds.datasets import load_source
    from synth.mechanisms.privimage.plan import plan_privimage

    sens = load_source("builtin:mnist5k")
    s = settings("cpu")
    for eps in EPSILONS:
        store = throwaway_store(tmp_path / f"ws-{eps:g}", "mnist5k", sens, eps, s["delta"])
        plan = plan_privimage(privimage_config(s, eps), len(sens), n_classes=10)
        charge = ledger.reserve(store, "mnist5k", plan.events, f"run-{eps:g}")
        assert charge.run_id == f"run-{eps:g}"
        store.backend.release()
