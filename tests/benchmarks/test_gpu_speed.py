"""benchmarks/gpu_speed.sh, the prepared GPU measurement of issue 34: its arguments, and a CPU dry run (`--device cpu
--tiny`) that executes every step a GPU run takes and writes the same JSON rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_speed.sh"


def _run(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frobnicate"], "unknown argument '--frobnicate'"),
        (["--device"], ""),
        (["--device", "tpu"], "--device must be cpu or cuda[:N], got 'tpu'"),
        (["--budget", "9m"], "--budget must be whole seconds, got '9m'"),
    ],
)
def test_bad_arguments_stop_with_the_usage_or_a_clear_error(args: list[str], message: str) -> None:
    done = _run(*args)
    assert done.returncode == 64
    assert message in done.stderr
    if not message:
        assert "gpu_speed.sh [--device cuda|cpu] [--tiny]" in done.stdout


def test_help_prints_the_usage() -> None:
    done = _run("--help")
    assert done.returncode == 64 and "noise.json" in done.stdout and "profile.json" in done.stdout


def test_a_machine_without_our_packages_is_told_which_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(SCRIPT, tmp_path / "benchmarks" / SCRIPT.name)
    venv.create(tmp_path / "bare", with_pip=False)  # the same interpreter, none of the packages
    done = subprocess.run(
        ["bash", str(tmp_path / "benchmarks" / SCRIPT.name), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "PY": str(tmp_path / "bare" / "bin" / "python"),
            "OUT": str(tmp_path / "out"),
        },
    )
    assert done.returncode == 2, done.stderr
    assert (
        "missing on this machine: torch opacus diffusers dp_accounting cryptography scipy"
        in done.stderr
    )
    assert not (tmp_path / "out" / "noise.json").exists()


@pytest.mark.slow
def test_cpu_dry_run_writes_every_row(tmp_path: Path) -> None:
    done = _run(
        "--device", "cpu", "--tiny", "--budget", "1400", "--out", str(tmp_path), timeout=1500
    )
    assert done.returncode == 0, done.stderr[-2000:]
    noise = json.loads((tmp_path / "noise.json").read_text())
    assert {r["path"].split(" ")[0] for r in noise} == {"AES-256-CTR", "ChaCha20", "torch.randn"}
    assert all(
        r["chacha20_on_device_matches_cryptography"] is True and r["device"] == "CPU" for r in noise
    )
    assert all(r["ms_per_million_normals"] > 0 for r in noise)
    steps = {r["row"]: r for r in json.loads((tmp_path / "steps.json").read_text())}
    wanted = [
        "plain (no DP)",
        "opacus hooks, grouped-conv, no summed conv gradients (product in float32)",
        "the product's whole DP-SGD loop (dp_finetune), float32",
        "the whole loop as before issue 34 (opacus DataLoader + BatchMemoryManager, per-tensor EMA), float32",
        "the whole loop, secure noise from the host's AES keystream (before issue 34), float32",
    ]
    for row in wanted:
        assert steps[row]["error"] is None and steps[row]["ms_per_step"] > 0, (row, steps.get(row))
    assert steps["plain (no DP)"]["vs_plain"] == 1.0 and steps["plain (no DP)"]["widths"] == [8, 16]
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["step_ms"] > 0 and "Adam" in profile["parts_ms"]
    assert "forward + backward + per-sample gradients (opacus hooks)" in profile["parts_ms"]
    assert sum(profile["parts_ms"].values()) <= profile["step_ms"] * 1.05


def test_only_selects_rows_by_semicolon_separated_parts_and_keeps_the_plain_step() -> None:
    import torch

    from benchmarks.dpsgd_throughput import methods

    rows = list(methods(torch.device("cuda"), "product in float32;before issue 34", all_rows=True))
    assert rows == [
        "plain (no DP)",
        "opacus hooks, grouped-conv, no summed conv gradients (product in float32)",
        "the whole loop as before issue 34 (opacus DataLoader + BatchMemoryManager, per-tensor EMA), float32",
        "the whole loop, secure noise from the host's AES keystream (before issue 34), float32",
    ]
    assert (
        "the whole loop, torch's generator for the noise (not secure; reference), float32"
        not in methods(torch.device("cpu"))
    )  # the noise-path rows are measured off the CPU (or with all_rows)


def test_the_profiler_labels_are_removed_afterwards() -> None:
    from opacus.optimizers.optimizer import DPOptimizer

    from benchmarks.dpsgd_throughput import _labelled
    from synth.mechanisms.privimage import training

    before = DPOptimizer.clip_and_accumulate, training._per_sample_gradients
    with _labelled():
        assert DPOptimizer.clip_and_accumulate is not before[0]
    assert (DPOptimizer.clip_and_accumulate, training._per_sample_gradients) == before


def test_a_labelled_part_counts_its_cpu_range_not_its_device_annotation() -> None:
    """On a GPU each record_function range appears twice in key_averages (the CPU range and a
    device-side annotation with no CPU time): the H100 profile read every part as 0 ms."""
    from types import SimpleNamespace

    from benchmarks.dpsgd_throughput import _by_label

    cpu = SimpleNamespace(key="Adam", cpu_time_total=900.0, device_time_total=40.0)
    annotation = SimpleNamespace(key="Adam", cpu_time_total=0.0, device_time_total=850.0)
    grouped = _by_label([cpu, annotation])
    assert max(e.cpu_time_total for e in grouped["Adam"]) == 900.0
    assert max(e.device_time_total for e in grouped["Adam"]) == 850.0
