#!/usr/bin/env bash
# DP-SGD at GPU speed (issue 34): every row of the issue's table side by side, as JSON rows, in at most 9 minutes.
#
#   bash benchmarks/gpu_speed.sh [--device cuda|cpu] [--tiny] [--out DIR] [--budget SECONDS]
#
# On the GPU (default --device cuda; UNet [32, 64, 64], batch 500, float32), in this order:
#   1. noise.json     the secure noise paths per million normals: the host's AES keystream, ChaCha20 on the device
#                     (its keystream first checked against `cryptography`'s ChaCha20), torch.randn
#   2. steps.json     plain step, plain channels-last, the product's DP step (and channels-last, and the grouped
#                     backward forced onto the GPU), the product's whole loop (dp_finetune), the loop as it was
#                     before issue 34, the loop with the host's AES noise, the loop with torch's (insecure) noise
#   3. profile.json   torch.profiler over one dp_finetune step: the parts' milliseconds and the top kernels
#   4. noise_compiled.json  ChaCha20 eager against its torch.compile'd block function (last: compiling takes a while;
#                     not with --tiny on the CPU)
# --tiny (with --device cpu: the dry run the tests make) shrinks everything to seconds. Results go to --out (else
# $OUT, else /tmp/gpu-out); the packages in .whl/ (benchmarks/gpu_lease.sh wheels: site.tar.xz, or loose wheels)
# are unpacked into /tmp/site first when present.
# PY (default python3) picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,17p' "$0"; exit 64; }
device=cuda tiny=0 out="${OUT:-/tmp/gpu-out}" budget=540 py="${PY:-python3}"
while [ $# -gt 0 ]; do
    case "$1" in
        --device) [ $# -ge 2 ] || usage; device="$2"; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
        --budget) [ $# -ge 2 ] || usage; budget="$2"; shift 2 ;;
        --tiny) tiny=1; shift ;;
        -h|--help) usage ;;
        *) echo "gpu_speed.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
case "$device" in cpu|cuda|cuda:[0-9]*) ;; *) echo "gpu_speed.sh: --device must be cpu or cuda[:N], got '$device'" >&2; exit 64 ;; esac
case "$budget" in ''|*[!0-9]*) echo "gpu_speed.sh: --budget must be whole seconds, got '$budget'" >&2; exit 64 ;; esac
mkdir -p "$out"

if [ -f .whl/site.tar.xz ] && [ ! -d /tmp/site ]; then  # what `gpu_lease.sh wheels` packs now
    mkdir -p /tmp/site && tar xJf .whl/site.tar.xz -C /tmp/site
fi
if compgen -G ".whl/*.whl" > /dev/null; then  # loose wheels, as its first version left them
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
missing=$("$py" -c "
import importlib.util
print(' '.join(m for m in 'torch opacus diffusers dp_accounting cryptography scipy'.split() if importlib.util.find_spec(m) is None))")
if [ -n "$missing" ]; then
    echo "missing on this machine: $missing (carry .whl/ from 'bash benchmarks/gpu_lease.sh wheels')" >&2
    exit 2
fi

if [ "$tiny" = 1 ]; then
    size=(--widths 8,16 --batch 20 --rounds 1 --reps 1) noise=(--tiny)
    rows="product in float32;the product's whole DP-SGD loop (dp_finetune), float32;before issue 34"
else
    size=(--widths 32,64,64 --batch 500 --rounds 3 --reps 5) noise=(--rounds 5)
    rows="plain, channels-last;product in float32;no summed conv gradients, channels-last;forced on this device, no"
    rows="$rows summed conv gradients;the product's whole DP-SGD loop (dp_finetune), float32;before issue 34"
    rows="$rows;torch's generator for the noise"
fi
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
[ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee "$out/gpu.txt" || true

echo "== 1/4 noise paths ($(left) s left)"
timeout $(( $(left) / 5 )) "$py" -m benchmarks.secure_noise_bench --paths --device "$device" "${noise[@]}" \
    --json "$out/noise.json" 2>&1 | tee "$out/noise.txt" || echo "noise paths: failed or out of time" >&2
echo "== 2/4 DP-SGD rows ($(left) s left)"
timeout $(( $(left) * 2 / 3 )) "$py" -m benchmarks.dpsgd_throughput --device "$device" "${size[@]}" --all-rows \
    --only "$rows" --json "$out/steps.json" 2>&1 | grep -v '^USDT' | tee "$out/steps.txt" \
    || echo "DP-SGD rows: failed or out of time" >&2
echo "== 3/4 profile of one loop step ($(left) s left)"
timeout $(( $(left) * 2 / 3 )) "$py" -m benchmarks.dpsgd_throughput --device "$device" "${size[@]:0:4}" --profile "$out/profile.json" \
    2>&1 | grep -v '^USDT' | tee "$out/profile.txt" || echo "profile: failed or out of time" >&2
if [ "$tiny" = 0 ] || [ "$device" != cpu ]; then
    echo "== 4/4 ChaCha20 compiled ($(left) s left)"
    timeout "$(left)" "$py" -m benchmarks.secure_noise_bench --paths --compiled --device "$device" "${noise[@]}" \
        --json "$out/noise_compiled.json" 2>&1 | tee "$out/noise_compiled.txt" || echo "compiled: failed or out of time" >&2
fi
echo "done in $((SECONDS - start)) s; results in $out"
