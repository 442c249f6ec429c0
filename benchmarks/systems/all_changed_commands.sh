#!/usr/bin/env bash
# Issue 61: a re-index where every row changed, as whole commands, on a CPU kind whose re-index runs without torch
# (avx512_fp16, forced as incremental_commands.sh forces it): A = the first N rows of V1 (incremental_commands.sh's
# 20,000-row corpus), B = the same ids with the next N rows' texts. Builds A, re-indexes B on it (every row encoded
# again, on the export without torch), then B with --full into an empty store on the same cache and on an empty one.
# Run with the virtualenv's bin first on PATH (its python and condsearch); prints each whole command's seconds.
#   PATH=$PWD/.venv/bin:$PATH benchmarks/systems/all_changed_commands.sh v1.parquet build/all-changed [N=5000]
set -euo pipefail
V1=$1 WORK=$2 N=${3:-5000}
C="color of the dress"
rm -rf "$WORK" && mkdir -p "$WORK"
python - "$V1" "$WORK" "$N" <<'PY'
import sys
import pyarrow.parquet as pq
v1, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = pq.read_table(v1)
a = t.slice(0, n)
b = a.set_column(a.schema.get_field_index("text"), "text", t.column("text").slice(n, n))
pq.write_table(a, f"{work}/a.parquet")
pq.write_table(b, f"{work}/b.parquet")
PY
export CONDSEARCH_CPU_KIND=avx512_fp16 ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16
run() { CONDSEARCH_CACHE_DIR="$WORK/$1" /usr/bin/time -f "$2 %e s" "${@:3}" 2>&1 | tail -2; }
run cache first condsearch index "$WORK/a.parquet" -c "$C" --name c --index-dir "$WORK/a"
run cache reindex-every-row-changed condsearch index "$WORK/b.parquet" -c "$C" --name c --index-dir "$WORK/a"
run cache full-same-cache condsearch index "$WORK/b.parquet" -c "$C" --name c --index-dir "$WORK/b" --full
run cache-2 full-empty-cache condsearch index "$WORK/b.parquet" -c "$C" --name c --index-dir "$WORK/c" --full
