#!/usr/bin/env bash
# Issue 38's GPU lease as one command: the GPU checks first, then WN18RR training until a deadline.
# Usage, on the device machine, from the repository root (its Python is python3):
#   benchmarks/systems/gpu_lease.sh BUNDLE OUT
# BUNDLE is what `python tools/device_bundle.py pack BUNDLE --data $W --data $C --wheel …`
# wrote here (carried by the call); OUT the folder that comes back. Everything under OUT is at most
# 8 files: checks.tar.gz (the checks' JSONs and log), train.log, kgc_dev.json if the run ended in
# time, and ctx/ (the best dev weights so far, both towers, written each time dev improves).
# Environment: END_AT (seconds after start when training must end, default 560), EPOCHS (6),
# LR (5e-5), SEED (21), ROUTER (benchmarks/weights/wn18rr-minilm-context), PRE_BATCH (2: SimKGC's
# pre-batch negatives, previous batches kept; 0: off), SKIP_CHECKS.
# Written after the third H200 lease from the commands that ran in it (benchmarks/systems/README.md,
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
timeout "$left" python3 -m benchmarks.paper.kgc --data-dir "$D/wn18rr" --router "${ROUTER:-benchmarks/weights/wn18rr-minilm-context}" \
    --link-graph --device cuda --train --bf16 --batch-size 1024 --lr "${LR:-5e-5}" --epochs "${EPOCHS:-6}" \
    --seed "${SEED:-21}" --pre-batch "${PRE_BATCH:-2}" --max-dev 1000 --checkpoint-dir /tmp/lease-ck --checkpoint-every 1000000 --project-every 85 \
    --save "$OUT/ctx" --split dev --max-test 1000 --json-out "$OUT/kgc_dev.json" >"$OUT/train.log" 2>&1
echo "[lease] training rc=$? at $(el)s (124: the deadline; ctx/ holds the best dev weights so far)"
grep -v "step .*loss" "$OUT/train.log" | tail -20
