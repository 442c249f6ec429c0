#!/usr/bin/env bash
# What only a GPU can measure (issues 38 and 61), run once per lease in a few minutes:
#   the tests marked gpu (FAISS's GPU indexes through the store's path among them, where its GPU
#   build is installed); exact and IVF search at 1M and 10M rows on the GPU (FAISS, torch) against
#   the CPU, recall beside each; with ENCODE=1, CASE encode throughput at float32 and bfloat16.
# Usage, from the repository root on a CUDA machine with condsearch's requirements:
#   benchmarks/systems/gpu_checks.sh CSTS_DIR OUT_DIR        (PY=python unless set; ROWS=1000000,10000000)
# Results: OUT_DIR/gpu_search.json and .md (and OUT_DIR/encode_throughput_{float32,bfloat16}.json); the
# test summary and tables on stdout. benchmarks/systems/gpu.md#gpu-runner quotes them.
set -u
C=$1
OUT=$2
PY=${PY:-python}
mkdir -p "$OUT"
"$PY" -c "import faiss; from condsearch.build.faiss_indexes import gpu_available; \
print('faiss', faiss.__version__, 'GPU build with a card:', gpu_available())"
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/model/encoders/test_gpu.py tests/model/encoders/test_llm_encoders.py tests/model/encoders/test_bellm.py
"$PY" -m benchmarks.systems.gpu_search --rows "${ROWS:-1000000,10000000}" --dims 256 --queries 30 \
    --json-out "$OUT/gpu_search.json" --md-out "$OUT/gpu_search.md"
if [ -n "${ENCODE:-}" ]; then
    for dtype in float32 bfloat16; do
        "$PY" -m benchmarks.systems.encode_throughput --csv "$C/train.csv" -n 20000 --batch-size 256 \
            --device cuda --dtype "$dtype" --json-out "$OUT/encode_throughput_$dtype.json"
    done
fi
