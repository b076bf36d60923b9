"""The GPU preset's pipeline at micro size on the CPU: one charged run writes its row and its released images,
scoring adds accuracies and a grid once; and the throughput benchmark's device options."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import dpsgd_throughput, gpu_preset
from synth.mechanisms.privimage import conv_grad_sample, training


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / gpu_preset.LOG).read_text().splitlines()]


@pytest.mark.slow  # end to end, about a minute on 2 cores (CI runs the slow tests too)
def test_a_micro_run_records_the_charged_release_and_scoring_adds_accuracies_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "gpu_preset",
            "--out",
            str(tmp_path),
            "--mode",
            "micro",
            "--runs",
            "mnist5k:10",
            "--set",
            "n_samples=60",
            "--set",
            "vote_pool=3",
        ],
    )
    gpu_preset.main()
    (run,) = _rows(tmp_path)
    assert (
        run["recipe"]["vote_pool"] == 3 and run["recipe"]["vote_sigma"] == 2.0
    )  # the vote of epsilon 10, overridden
    assert (
        run["dataset"] == "mnist5k"
        and run["epsilon"] == 10.0
        and run["steps"] > 0
        and run["sigma"] > 0
    )
    assert run["recipe"]["n_samples"] == run["n_released"] == 60
    release = np.load(tmp_path / f"{run['tag']}.npz")
    assert (
        release["images"].shape == (run["n_released"], 28, 28)
        and release["images"].dtype == np.uint8
    )
    assert len(release["labels"]) == run["n_released"]

    monkeypatch.setattr(
        sys, "argv", ["gpu_preset", "--out", str(tmp_path), "--mode", "micro", "--score"]
    )
    gpu_preset.main()
    gpu_preset.main()  # a second scoring finds nothing left to score
    rows = _rows(tmp_path)
    assert len(rows) == 2
    scored = rows[1]
    assert scored["tag"] == run["tag"] and set(scored["acc"]) == {"logreg", "mlp", "cnn"}
    assert all(0.0 <= a <= 1.0 for a in scored["acc"].values())
    assert (tmp_path / scored["grid"]).stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--runs", "mnist5k:10,cifar:10"], "unknown source 'cifar'"),
        (["--runs", "mnist5k:10,mnist5k"], "give source:epsilon"),
        (["--runs", "mnist5k:10,fashion:ten"], "give source:epsilon"),
        (["--runs", "mnist5k:10,fashion:1:dpgan"], "unknown mechanism 'dpgan'"),
        (
            ["--runs", "fashion:1:merf", "--score-with", "cpu-cnn,vgg"],
            "unknown classifier 'vgg'",
        ),
    ],
)
def test_a_bad_run_list_or_classifier_is_refused_before_anything_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.setattr(sys, "argv", ["gpu_preset", "--out", str(tmp_path), *args])
    with pytest.raises(SystemExit):
        gpu_preset.main()
    assert message in capsys.readouterr().err
    assert not (tmp_path / gpu_preset.LOG).exists()


def test_a_failed_run_is_recorded_and_scoring_skips_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(sys, "argv", ["gpu_preset", "--out", str(tmp_path), "--score"])
    with pytest.raises(SystemExit):
        gpu_preset.main()
    assert "nothing to score" in capsys.readouterr().err
    monkeypatch.setattr(
        sys,
        "argv",
        ["gpu_preset", "--out", str(tmp_path), "--mode", "micro", "--runs", "mnist5k:nan"],
    )
    gpu_preset.main()
    (row,) = _rows(tmp_path)
    assert row["dataset"] == "mnist5k" and "epsilon" in row["error"].lower()
    monkeypatch.setattr(sys, "argv", ["gpu_preset", "--out", str(tmp_path), "--score"])
    gpu_preset.main()
    assert len(_rows(tmp_path)) == 1


@pytest.mark.parametrize(
    "setting, message",
    [
        ("batch_size", "KEY=VALUE"),
        ("no_such_key=1", "KEY=VALUE with KEY one of"),
        ("batch_size=big", "must be JSON"),
    ],
)
def test_a_bad_override_is_refused_before_anything_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    setting: str,
    message: str,
) -> None:
    monkeypatch.setattr(sys, "argv", ["gpu_preset", "--out", str(tmp_path), "--set", setting])
    with pytest.raises(SystemExit):
        gpu_preset.main()
    assert message in capsys.readouterr().err
    assert not (tmp_path / gpu_preset.LOG).exists()


def test_forced_grouped_rows_exist_only_off_the_cpu_and_restore_the_product_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not set(dpsgd_throughput.FORCED) & set(dpsgd_throughput.methods(torch.device("cpu")))
    assert set(dpsgd_throughput.FORCED) <= set(dpsgd_throughput.methods(torch.device("cuda")))
    # a device where the product does not use the grouped backward: forced for the step, then not again
    monkeypatch.setattr(conv_grad_sample, "GROUPED_DEVICES", set())
    seen: list[bool] = []
    original = conv_grad_sample.covered
    monkeypatch.setattr(
        conv_grad_sample, "covered", lambda layer, x: seen.append(original(layer, x)) or seen[-1]
    )
    name = next(iter(dpsgd_throughput.FORCED))
    dpsgd_throughput._step_fn(dpsgd_throughput.FORCED[name], 4, torch.device("cpu"), (8, 16))()
    assert seen and all(seen)
    assert conv_grad_sample.GROUPED_DEVICES == set()
    seen.clear()
    product = dpsgd_throughput.METHODS[
        "opacus hooks, grouped-conv, no summed conv gradients (product in float32)"
    ]
    dpsgd_throughput._step_fn(product, 4, torch.device("cpu"), (8, 16))()
    assert seen and not any(seen)


def test_the_gpu_table_gets_its_own_section_title(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make bench` splices the CPU table by its title: a GPU table under the same title would be overwritten."""
    monkeypatch.setattr(dpsgd_throughput, "_device_name", lambda device: "a test GPU")
    result = {name: 0.05 for name in dpsgd_throughput.methods(torch.device("cuda"))}
    gpu = dpsgd_throughput.render(result, 8, 1.0, torch.device("cuda"), (32, 64, 64))
    assert (
        gpu.startswith("## DP-SGD step cost on one GPU")
        and "a test GPU" in gpu
        and "[32, 64, 64]" in gpu
    )
    assert "forced on this device" in gpu  # every measured row is rendered
    cpu = dpsgd_throughput.render({n: 0.05 for n in dpsgd_throughput.METHODS}, 8, 1.0)
    assert (
        cpu.startswith("## DP-SGD step cost by per-sample-gradient method") and "forced" not in cpu
    )


def test_the_whole_loop_rows_time_dp_finetune_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop rows run the product's dp_finetune (secure noise, EMA, write-ahead log) and report the median
    interval between its steps: reps intervals need reps + 1 steps."""
    calls: list[dict] = []
    real = training.dp_finetune  # benchmarks.common.run_dp_finetune imports it when called
    monkeypatch.setattr(
        training, "dp_finetune", lambda *a, **kw: calls.append(kw) or real(*a, **kw)
    )
    loops = [name for name, m in dpsgd_throughput.METHODS.items() if m.get("loop")]
    assert len(loops) == 3  # float32, the loop as before issue 34 (for the A/B), bfloat16 autocast
    seconds = dpsgd_throughput._loop_time(
        dpsgd_throughput.METHODS[loops[0]], 8, torch.device("cpu"), (8, 16), 2
    )
    assert seconds > 0 and calls[0]["steps"] == 3 and calls[0]["max_physical_batch"] >= 2 * 8
    assert calls[0].get("secure_noise", True) is True  # the product's default: secure noise on


def test_set_takes_json_or_a_bare_word_and_refuses_the_rest() -> None:
    import argparse

    from benchmarks.reproduce_settings import settings

    parser = argparse.ArgumentParser()
    s = settings("cpu")
    gpu_preset.apply_sets(
        parser, s, ["vote_space=embedding", "vote_pool=16", "unet_channels=[32, 64, 64]"]
    )
    assert s["privimage"]["vote_space"] == "embedding" and s["privimage"]["unet_channels"] == [
        32,
        64,
        64,
    ]
    assert {v["vote_pool"] for v in s["vote"].values()} == {
        16
    }  # vote settings go into every epsilon's vote
    for bad in ("vote_space=two words", "epsilon=3", "nonsense=1", "vote_pool=", "vote_pool=eight"):
        with pytest.raises(SystemExit):
            gpu_preset.apply_sets(parser, settings("cpu"), [bad])


# Slow since issue 63 (end to end: a run of the benchmark; fast:
# test_set_takes_json_or_a_bare_word_and_refuses_the_rest)
@pytest.mark.slow
def test_fashion_cpu_takes_set_too() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.fashion_cpu", "--epsilons", "", "--set", "bogus=1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2 and "--set 'bogus=1': give KEY=VALUE with KEY one of" in done.stderr


def test_merf_bandwidth_refuses_an_unknown_setting_before_reading_data(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # its main() in this process, as the gpu_preset tests above (a `python -m` subprocess spent
    # ~2.5 s importing torch and the packages again)
    from benchmarks import merf_bandwidth

    monkeypatch.setattr(sys, "argv", ["merf_bandwidth", "--variants", '[{"bogus": 1}]'])
    with pytest.raises(SystemExit) as done:
        merf_bandwidth.main()
    assert done.value.code == 2 and "unknown settings ['bogus']" in capsys.readouterr().err


def test_merf_bandwidth_baseline_is_a_generator_setting_of_pixel_features_alone() -> None:
    """The config's perceptual_share default is "auto" (the plan's call); the benchmark's baseline
    must be a number (a string reached the feature map and stopped a run), and 0: its rows were
    measured on pixel features alone."""
    from benchmarks.merf_bandwidth import BASE
    from synth.tools.kernel.embedding import FeatureMap, frequencies
    from synth.tools.kernel.fit import MerfSettings

    s = MerfSettings(**BASE)
    assert s.perceptual_share == 0.0 and s.bandwidth == 105.0
    assert FeatureMap(frequencies(16, 8, s.bandwidth, 0), s.perceptual_share).share == 0.0


def test_a_run_names_its_mechanism_and_privimage_is_the_default() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    assert gpu_preset._run_spec(parser, "fashion:1") == ("fashion", 1.0, "privimage")
    assert gpu_preset._run_spec(parser, "fashion:10:merf") == ("fashion", 10.0, "merf")
    assert gpu_preset._classifiers(parser, "cpu-cnn,wrn") == ("cpu-cnn", "wrn")
