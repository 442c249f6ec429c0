#!/usr/bin/env bash
# Issue 38's GPU lease as one command: the GPU checks first, then WN18RR training until a deadline.
# Usage, on the device machine, from the repository root (its Python is python3):
#   benchmarks/systems/gpu_lease.sh BUNDLE OUT
# BUNDLE is what `python tools/device_bundle.py pack BUNDLE --data $W --data $C --wheel …`
# wrote here (carried by the call); OUT the folder that comes back. Everything under OUT is at most
# 8 files: checks.tar.gz (the checks' JSONs and log), train.log, kgc_dev.json if the run ended in
# time, and ctx/ (the best dev weights so far, both towers, written each time dev improves).
# Environment: END_AT (seconds after start when training must end, default 560), EPOCHS (6), AB (run
# pre-batch 0 and PRE_BATCH side by side, each on half the cores, into ctx_pb0/ and ctx_pbN/),
# LR (5e-5), SEED (21), ROUTER (benchmarks/weights/wn18rr-minilm-context), PRE_BATCH (2: SimKGC's
# pre-batch negatives, previous batches kept; 0: off), SKIP_CHECKS.
# Written after the third H200 lease from the commands that ran in it (benchmarks/systems/gpu.md,
# "GPU runner"); this script itself first runs in the next lease.
set -u
B=$1
OUT=$2
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
S=/tmp/lease-site
D=/tmp/lease-data
python3 tools/device_bundle.py unpack "$B" "$S" "$D" || exit 3
export PYTHONPATH=$PWD:$S PYTHONUNBUFFERED=1
if [ -d "$S/cuda12-libs" ]; then  # faiss-gpu-cu12 on a CUDA 13 image: CUDA 12's runtime and the cuBLAS shim
    CUBLAS13=$(find /opt /usr/local /usr/lib -name libcublas.so.13 2>/dev/null | head -n 1)
    export LD_LIBRARY_PATH=$S/cuda12-libs:$(dirname "${CUBLAS13:-/nonexistent/x}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export _FAISS_WHEEL_DISABLE_CUDA_PRELOAD=1  # faiss-gpu-cu12's loader looks for CUDA 12's pip packages otherwise
    # faiss-gpu's own loader opens them from CUDA 12's pip layout (nvidia/<part>/lib): that layout, pointing here
    # (cuRAND, which FAISS loads but never calls, is the image's: its soname is .10 in CUDA 12 and 13 alike)
    mkdir -p "$S/nvidia/cuda_runtime/lib" "$S/nvidia/cublas/lib" "$S/nvidia/curand/lib"
    ln -sf "$S/cuda12-libs/libcudart.so.12" "$S/nvidia/cuda_runtime/lib/"
    ln -sf "$S/cuda12-libs/libcublas.so.12" "$S/cuda12-libs/libcublasLt.so.12" "$S/nvidia/cublas/lib/"
    ln -sf "$(dirname "${CUBLAS13:-/nonexistent/x}")/libcurand.so.10" "$S/nvidia/curand/lib/"
    echo "[lease] cuBLAS 13 at ${CUBLAS13:-nowhere}"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import faiss; from condsearch.model.sources import resolve_model; print(resolve_model(None))" || exit 3
echo "[lease] unpacked at $(el)s"
mkdir -p "$OUT/checks"
if [ -z "${SKIP_CHECKS:-}" ]; then
    PY=python3 timeout 230 benchmarks/systems/gpu_checks.sh "$D/csts-reannotated" "$OUT/checks" >"$OUT/checks/log" 2>&1
    echo "[lease] checks rc=$? at $(el)s"
    grep -E "passed|failed" "$OUT/checks/log" | tail -3
fi
(cd "$OUT/checks" && tar czf ../checks.tar.gz .) && rm -rf "$OUT/checks"
left=$((${END_AT:-560} - $(el)))
echo "[lease] training for at most ${left}s"
train() {  # train PRE_BATCH CORES NAME: one segment from ROUTER, its best dev weights in OUT/NAME
    taskset -c "$2" timeout "$left" python3 -m benchmarks.paper.kgc --data-dir "$D/wn18rr" \
        --router "${ROUTER:-benchmarks/weights/wn18rr-minilm-context}" --link-graph --device cuda --train --bf16 \
        --batch-size 1024 --lr "${LR:-5e-5}" --epochs "${EPOCHS:-6}" --seed "${SEED:-21}" --pre-batch "$1" \
        --max-dev 1000 --checkpoint-dir "/tmp/lease-ck-$3" --checkpoint-every 1000000 --project-every 85 \
        --save "$OUT/$3" --split dev --max-test 1000 --json-out "$OUT/kgc_dev_$3.json" >"$OUT/train_$3.log" 2>&1
    echo "[lease] training $3 rc=$? at $(el)s (124: the deadline; $3/ holds the best dev weights so far)"
}
if [ -n "${AB:-}" ]; then  # issue 62's ablation: the same segment without and with pre-batch negatives, side by side
    train 0 0-7 ctx_pb0 &
    train "${PRE_BATCH:-2}" 8-15 "ctx_pb${PRE_BATCH:-2}" &
    wait
else
    train "${PRE_BATCH:-2}" 0-15 ctx
fi
for f in "$OUT"/train_*.log; do echo "== $f"; grep -v "step .*loss" "$f" | tail -12; done
