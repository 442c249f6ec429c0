#!/usr/bin/env bash
# Issue 61, item 2: a re-index (V1's index, V2's rows: 1.5% changed) with the code at BEFORE (a git revision, run
# from a worktree) and with this checkout's, alternating for ROUNDS rounds, each on a fresh copy of one first build's
# index and cache; then `--full` of V2 into an empty store and cache, and each re-index against it: the largest
# vector difference and the top-10 of 200 queries (the full index's vectors of 200 rows spread over the corpus).
#   benchmarks/systems/reindex_before_after.sh v1.parquet v2.parquet build/before-after 06410e8
set -euo pipefail
V1=$(realpath "$1") V2=$(realpath "$2") WORK=$3 BEFORE=$4 ROUNDS=${ROUNDS:-2}
C="color of the dress"
ROOT=$(git rev-parse --show-toplevel)
rm -rf "$WORK" && mkdir -p "$WORK" && WORK=$(realpath "$WORK")
git -C "$ROOT" worktree add --detach "$WORK/before" "$BEFORE" > /dev/null
trap 'git -C "$ROOT" worktree remove --force "$WORK/before"' EXIT
cd "$WORK"  # not the checkout: `python -m` puts the working directory ahead of PYTHONPATH
run() { CONDSEARCH_CACHE_DIR="$1" /usr/bin/time -f "$2 %e s" "${@:3}" 2>&1 | tail -2; }
run "$WORK/cache" first condsearch index "$V1" -c "$C" --name c --index-dir "$WORK/first"
for round in $(seq "$ROUNDS"); do
    for code in after before; do
        d="$WORK/$code$round" && mkdir -p "$d" && cp -r "$WORK/first" "$d/idx" && cp -r "$WORK/cache" "$d/cache"
        pp="" && [ "$code" = before ] && pp="$WORK/before"
        sync && sleep 2
        PYTHONPATH=$pp run "$d/cache" "$code round $round" python -m condsearch index "$V2" -c "$C" --name c --index-dir "$d/idx"
    done
done
run "$WORK/cache-full" full condsearch index "$V2" -c "$C" --name c --index-dir "$WORK/full" --full
python - "$WORK" <<'PY'
import glob, json, sys
import numpy as np
import pyarrow.parquet as pq

def load(d):
    (folder,) = glob.glob(f"{d}/*/")
    ids = np.asarray(pq.read_table(folder + "rows.parquet").column("id").to_pylist())
    order = np.argsort(ids)
    return ids[order], np.load(folder + "vectors.npy")[order], json.load(open(folder + "manifest.json"))

work = sys.argv[1]
ids, full, manifest = load(f"{work}/full")
queries = full[np.linspace(0, len(full) - 1, 200).astype(int)]
want = np.argsort(-(queries @ full.T), axis=1)[:, :10]
for d in sorted(glob.glob(f"{work}/[ab]*[0-9]")):
    got_ids, vectors, m = load(f"{d}/idx")
    assert (got_ids == ids).all()
    got = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    same = sum(set(a) == set(b) for a, b in zip(got, want))
    print(json.dumps({"run": d.rsplit("/", 1)[1], "max_vector_diff": float(np.abs(vectors - full).max()),
                      "same_top10": f"{same}/200", "fingerprint_equal": m["fingerprint"] == manifest["fingerprint"]}))
PY
