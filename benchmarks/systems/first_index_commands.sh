#!/bin/bash
# issue 61 item 5: a first index (empty store, empty cache), default mode, per kind, default against --backend torch,
# at each size in SIZES (default "500 5000"; first50000.parquet: the first 50,000 texts of benchmarks._lib.common.REAL_TEXTS)
# run from a folder holding first500.parquet and first5000.parquet (the first rows of the 20,000-row corpus of
# incremental_commands.sh), with VENV naming the virtualenv (default .venv there); prints each whole command's seconds.
# KINDS (default "amx avx512_fp16"): the kinds to force. QUERY=1: after each build, time the first one-shot
# `condsearch query` and a second one (what the export written by the default build is for)
set -euo pipefail
export PATH="${VENV:-.venv}/bin:$PATH"
C="color of the dress"
for kind in ${KINDS:-amx avx512_fp16}; do
  for n in ${SIZES:-500 5000}; do
    for path in default torch; do
      extra=(); [ $path = torch ] && extra=(--backend torch)
      env=(CONDSEARCH_CPU_KIND=$kind); [ $kind = avx512_fp16 ] && env+=(ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16)
      rm -rf f-tmp; mkdir -p f-tmp
      env "${env[@]}" CONDSEARCH_CACHE_DIR=$PWD/f-tmp/cache /usr/bin/time -f "$kind $n $path %e s" condsearch index first$n.parquet -c "$C" --name c --index-dir f-tmp/idx "${extra[@]}" 2>&1 | tail -2
      if [ "${QUERY:-0}" = 1 ]; then
        for q in first second; do
          env "${env[@]}" CONDSEARCH_CACHE_DIR=$PWD/f-tmp/cache /usr/bin/time -f "$kind $n $path $q-query %e s" condsearch query "a girl in an orange dress" -c "$C" --index-dir f-tmp/idx -k 5 2>&1 >/dev/null | tail -1
        done
      fi
    done
  done
done
