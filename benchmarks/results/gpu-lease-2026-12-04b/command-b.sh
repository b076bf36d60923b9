# lease command B: PrivImage preset eps 1 (release only, kept on the device for command C's WRN) beside a
# DP-MERF eps 1 release scored on the device with the WRN and cpu-cnn (bfloat16 autocast)
set -u
PY=${PY:-python3}; S=${SITE:-/tmp/site}; K=/tmp/keep; O=${OUT:-/tmp/gpu-out}; T=${T:-470}
mkdir -p $S $K $O/pi $O/merf
[ "${UNPACK:-1}" = 1 ] && tar xJf .whl/site.tar.xz -C $S
export PYTHONPATH=$S:$PWD PYTHONUNBUFFERED=1 PRIVRELEASE_CACHE=/tmp/privrelease-cache PRIVRELEASE_DATA_DIR=$PWD/.whl/data/fashion-mnist
nvidia-smi --query-gpu=name,memory.total --format=csv > $O/gpu.txt 2>&1; nproc >> $O/gpu.txt
start=$SECONDS
(timeout $T $PY -m benchmarks.gpu_preset --mode ${MODE:-full} --out $O/pi --runs fashion:1 --protocol dpimagebench > $O/pi.log 2>&1; cp $O/pi/*.npz $K/release.npz; echo "pi done at $((SECONDS-start)) s" >> $O/pi.log) &
$PY -m benchmarks.dpimagebench --write-sets $K/fashion-sets.npz --dataset fashion > $O/sets.log 2>&1
if [ "${MERF:-1}" = 1 ]; then
(timeout ${TM:-500} $PY -m benchmarks.gpu_preset --mode ${MODE:-full} --out $O/merf --runs fashion:1:merf --protocol dpimagebench --score-with wrn,cpu-cnn --score-precision bfloat16 --score-epochs ${EPOCHS:-50} > $O/merf.log 2>&1; echo "merf done at $((SECONDS-start)) s" >> $O/merf.log) &
fi
wait
ls -la $K
$PY -m benchmarks.gpu_preset --out $O/merf --fit-mib 5 || true
$PY -m benchmarks.gpu_preset --out $O/pi --fit-mib 50 || true
(cd $O/pi && tar cf - . | split -b 15m - $O/pi.tgz. && cd / && rm -rf $O/pi) || true
tail -n 4 $O/pi.log $O/merf.log
ls -la $O
