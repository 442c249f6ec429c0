#!/usr/bin/env bash
# Issue 61, item 2: `condsearch index` as whole commands on a 20,000-row corpus, 1.5% of it changed, per CPU kind:
# the first build (V1), the re-index of V2 on it (incremental), V2 with --full into an empty store with an empty
# cache, and the re-index back to V1. V1 and V2: parquet files with `id` and `text` (V2: 100 rows edited, 100
# deleted, 100 added). The kind's path is forced as the kind would take it (CONDSEARCH_CPU_KIND; for avx512_fp16,
# oneDNN's AMX hidden too, as on such a host). Prints each command's seconds (/usr/bin/time).
#   benchmarks/systems/incremental_commands.sh v1.parquet v2.parquet build/incr-kinds "avx512_fp16 amx"
set -euo pipefail
V1=$1 V2=$2 WORK=$3 KINDS=${4:-"avx512_fp16 amx"}
C="color of the dress"
for kind in $KINDS; do
    rm -rf "$WORK/$kind" && mkdir -p "$WORK/$kind"
    env=(CONDSEARCH_CPU_KIND="$kind")
    [ "$kind" = avx512_fp16 ] && env+=(ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16)
    run() { env "${env[@]}" CONDSEARCH_CACHE_DIR="$WORK/$kind/$1" /usr/bin/time -f "$kind $2 %e s" "${@:3}" 2>&1 | tail -2; }
    run cache-a first condsearch index "$V1" -c "$C" --name c --index-dir "$WORK/$kind/a"
    run cache-a incremental condsearch index "$V2" -c "$C" --name c --index-dir "$WORK/$kind/a"
    run cache-b full condsearch index "$V2" -c "$C" --name c --index-dir "$WORK/$kind/b" --full
    run cache-a incremental-back condsearch index "$V1" -c "$C" --name c --index-dir "$WORK/$kind/a"
done
