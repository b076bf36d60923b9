"""benchmarks/gpu_lease.sh, the prepared script for a GPU lease: what it does where no GPU is needed."""
from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_lease.sh"


def test_without_a_command_it_prints_its_usage() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 64
    assert "gpu_lease.sh wheels" in done.stdout and "gpu_lease.sh run [RUNS]" in done.stdout


def test_a_machine_without_our_packages_is_told_which_before_anything_runs(tmp_path: Path) -> None:
    """No wheels carried and a bare Python: the run stops at once and names every missing import."""
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(SCRIPT, tmp_path / "benchmarks" / SCRIPT.name)
    venv.create(tmp_path / "bare", with_pip=False)  # the same interpreter, none of the packages
    done = subprocess.run(["bash", str(tmp_path / "benchmarks" / SCRIPT.name), "run"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PY": str(tmp_path / "bare" / "bin" / "python"),
                               "OUT": str(tmp_path / "out")})
    assert done.returncode == 2, done.stderr
    assert "missing on this machine: opacus diffusers dp_accounting duckdb" in done.stderr
    assert not (tmp_path / "out" / "gpu.txt").exists()  # nothing ran
