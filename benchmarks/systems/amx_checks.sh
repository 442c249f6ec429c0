#!/usr/bin/env bash
# Issue 42's AMX column on a lent GPU machine's host (an Intel Xeon with AMX), as one command: what
# the project's own machines (AMD EPYCs) cannot measure, each step pinned to two cores as a 2-core
# machine runs, the card hidden, in the order issue 42 still needs them, each under its own limit:
#   1. `condsearch serve` at 100,000 rows, on the path `auto` takes on this kind (the must-show),
#      CASE and the router (the default mode of the default model);
#   2. every CASE path beside sentence-transformers with its share of peak, under one condition
#      (onnxruntime int8 on AMX among them);
#   3. the router's paths, bfloat16 included (timed only; C-STS dev of the paths comes from the AMD).
# Usage, from the repository root there (after tools/device_bundle.py unpack, PYTHONPATH set):
#   benchmarks/systems/amx_checks.sh CSTS_DIR OUT_DIR     (PY=python3, CORES=0,1 unless set)
# QUICK=1 runs each step's --smoke instead (a check of the plumbing on any CPU). Each step writes
# OUT_DIR/<step>.json and .log; a step whose tools are missing there (fastapi and uvicorn for
# serve, sentence-transformers for the peer) fails alone and says so in its log.
set -u
C=$1
OUT=$2
PY=${PY:-python3}
CORES=${CORES:-0,1}
mkdir -p "$OUT"
export CUDA_VISIBLE_DEVICES=""  # the CPU's paths: an index or a server left to itself would take the card
grep -q -w amx_tile /proc/cpuinfo && echo "[amx] amx_tile present" || echo "[amx] no amx_tile: not an AMX CPU"
step() {  # step NAME SECONDS ARGS...: one benchmark on the pinned cores, its rc and last line on stdout
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    taskset -c "$CORES" timeout "$limit" "$PY" -m "$@" --json-out "$OUT/$name.json" >"$OUT/$name.log" 2>&1
    echo "[amx] $name rc=$? in $((SECONDS - t0))s: $(tail -n 1 "$OUT/$name.log")"
}
if [ -n "${QUICK:-}" ]; then
    step serve_100k_amx 300 benchmarks.systems.serve --smoke
    step serve_100k_csr_amx 300 benchmarks.systems.serve --smoke --mode csr --stage-backends none
    step encode_paths_amx_one 300 benchmarks.systems.encode_throughput --smoke --quantize int8 --one-condition
    step csr_paths_amx 300 benchmarks.systems.csr_paths --smoke --no-csts
    exit 0
fi
step serve_100k_amx 240 benchmarks.systems.serve --requests 500 --seconds 20 --stage-backends none \
    --cli-repeats 3 --md-out "$OUT/serve_100k_amx.md"
step serve_100k_csr_amx 240 benchmarks.systems.serve --mode csr --requests 500 --seconds 20 --stage-backends none \
    --cli-repeats 3 --md-out "$OUT/serve_100k_csr_amx.md"
step encode_paths_amx_one 240 benchmarks.systems.encode_throughput --csv "$C/dev.csv" -n 1000 --quantize int8 \
    --repeats 3 --threads 2 --peak-size 4096 --one-condition --md-out "$OUT/encode_paths_amx_one.md"
step csr_paths_amx 150 benchmarks.systems.csr_paths --dev "$C/dev.csv" --threads 2 --no-csts --n-texts 256 \
    --repeats 3 --md-out "$OUT/csr_paths_amx.md"
