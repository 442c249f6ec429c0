#!/usr/bin/env bash
# What only a GPU can measure (issue 38, item 3), run once per lease in a few minutes:
#   the tests marked gpu; CASE encode throughput at float32 and bfloat16 against the card's
#   bf16 matrix-multiply bound; exact search at 1M rows on the GPU against the CPU.
# Usage, from the repository root on a CUDA machine with condsearch's requirements:
#   benchmarks/systems/gpu_checks.sh CSTS_DIR OUT_DIR        (PY=python unless set)
# Results: OUT_DIR/encode_throughput_{float32,bfloat16}.json, OUT_DIR/gpu_search.json; the
# test summary and tables on stdout. benchmarks/systems/README.md#gpu-runner quotes them.
set -u
C=$1
OUT=$2
PY=${PY:-python}
mkdir -p "$OUT"
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_llm_encoders.py tests/test_bellm.py
for dtype in float32 bfloat16; do
    "$PY" -m benchmarks.systems.encode_throughput --csv "$C/train.csv" -n 20000 --batch-size 256 \
        --device cuda --dtype "$dtype" --json-out "$OUT/encode_throughput_$dtype.json"
done
"$PY" -m benchmarks.systems.gpu_search --rows 1000000 --dims 256,384 --json-out "$OUT/gpu_search.json"
