# lease command C: the WRN (bfloat16 autocast) on the PrivImage release command B left in /tmp/keep
set -u
PY=${PY:-python3}; O=${OUT:-/tmp/gpu-out}; K=/tmp/keep
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ls -la $K
timeout ${T:-540} $PY -m benchmarks.dpimagebench $K/release.npz --dataset fashion --epsilon 1 --classifier wrn \
    --precision bfloat16 --sets $K/fashion-sets.npz --label "privimage gpu preset, epsilon 1" --epochs ${EPOCHS:-50} --out $O/wrn.jsonl 2>&1 | tail -60
