#!/usr/bin/env bash
# The GPU checks of the synthetic-data work, as one prepared script for a short GPU lease (a machine with
# PyTorch + CUDA but no network and none of our other packages).
#
#   bash benchmarks/gpu_lease.sh wheels        # here, with network: the missing packages as Python 3.12 wheels
#                                              # in .whl/ (ignored by git; about 35 MB)
#   bash benchmarks/gpu_lease.sh run [RUNS]    # there, with .whl/ carried along; results under $OUT (or /tmp/gpu-out)
#
# `run` installs the wheels into /tmp/site, says which imports are still missing (and stops) if any, then
#   1. the DP-SGD step cost on the GPU with the product's loop rows (benchmarks.dpsgd_throughput --device cuda),
#   2. the GPU preset (benchmarks.gpu_preset --mode full) for RUNS (default "fashion:1,mnist5k:10"),
# and packs the preset's rows and released images into $OUT/preset.tgz, to be scored on the CPU afterwards:
#   mkdir DIR && tar xzf preset.tgz -C DIR && python -m benchmarks.gpu_preset --out DIR --score
# BUDGET (seconds, default 540) bounds the preset so the results come back inside one 10-minute command;
# PY (default python3) and MODE (default full; micro for a smoke test on any machine) change what runs.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(opacus==1.6.0 diffusers==0.42.1 dp-accounting==0.6.0 dm-tree==0.1.10 duckdb==2.0.0
        cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 tomli-w==1.2.0)
IMPORTS="opacus diffusers dp_accounting duckdb cryptography tomli_w sklearn pyarrow rich yaml matplotlib"

wheels() {
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 -d .whl "${WHEELS[@]}"
    ls -la .whl && du -sh .whl
}

run() {
    local runs="${1:-fashion:1,mnist5k:10}" out="${OUT:-/tmp/gpu-out}" budget="${BUDGET:-540}" py="${PY:-python3}"
    mkdir -p "$out"
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    fi
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 PRIVRELEASE_CACHE=/tmp/privrelease-cache
    local missing
    missing=$("$py" -c "
import importlib.util
print(' '.join(m for m in '$IMPORTS'.split() if importlib.util.find_spec(m) is None))")
    if [ -n "$missing" ]; then
        echo "missing on this machine: $missing (add their wheels to WHEELS in benchmarks/gpu_lease.sh)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee "$out/gpu.txt" || true
    local started=$SECONDS
    timeout 150 "$py" -m benchmarks.dpsgd_throughput --device cuda 2>&1 | tee "$out/throughput.txt" || true
    local left=$((budget - (SECONDS - started)))
    echo "GPU preset $runs, $left s left"
    timeout "$left" "$py" -m benchmarks.gpu_preset --mode "${MODE:-full}" --out "$out/preset" --runs "$runs" 2>&1 \
        | tail -40 | tee "$out/preset.txt" || true
    # back here: tar xzf preset.tgz -C DIR && python -m benchmarks.gpu_preset --out DIR --score
    (cd "$out/preset" 2>/dev/null && tar czf "$out/preset.tgz" . && rm -rf "$out/preset") || true
}

case "${1:-}" in
    wheels) wheels ;;
    run) shift; run "$@" ;;
    *) sed -n '2,15p' "$0"; exit 64 ;;
esac
