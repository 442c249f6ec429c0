#!/usr/bin/env python3
"""What a user sees, as hashes, to show that a refactor changed no behaviour (issue 40).

Indexes the demo corpus with the embedded model in five ways (CASE `full`, CASE `lora`, the router
`--mode csr`, CASE int8, CASE bfloat16) through the CLI, then records for each: the sha256 of every `vectors.npy`,
the bytes of `query --json`, the answers of `condsearch serve` (a real server on loopback) and of
the Python API (`condsearch.open(...).search`). Run it before and after a change and compare:

    python tools/behaviour_snapshot.py --out build/snapshot-before.json
    python tools/behaviour_snapshot.py --out build/snapshot-after.json --compare build/snapshot-before.json

The JSON also says, per variant, whether the API's answers equal the server's exactly.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
import tempfile
from pathlib import Path

VARIANTS = {
    "full": ["--mode", "case", "--profile", "full"],
    "lora": ["--mode", "case", "--profile", "lora"],
    "csr": ["--mode", "csr"],
    "int8": ["--mode", "case", "--quantize", "int8"],
    "bfloat16": ["--mode", "case", "--dtype", "bfloat16"],
}
CONDITION = "color of the dress"
QUERIES = ["A girl in an orange dress plays tennis", "Two men play soccer on a field"]
K = 5


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _demo_csv(folder: Path) -> Path:
    from importlib.resources import files

    rows = files("condsearch").joinpath("data/demo_corpus.tsv").read_text().splitlines()
    path = folder / "demo.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        for line in rows:
            writer.writerow(line.split("\t", 1))
    return path


def _cli(*args: str) -> str:
    from click.testing import CliRunner

    from condsearch.cli import main

    result = CliRunner().invoke(main, list(args))
    if result.exit_code != 0:
        raise SystemExit(f"condsearch {' '.join(args)}: exit {result.exit_code}: {result.output}")
    return result.stdout


def snapshot_variant(name: str, flags: list[str], corpus: Path, root: Path) -> dict[str, object]:
    import httpx

    import condsearch
    from condsearch.serve.config import ServeConfig
    from condsearch.serve.server import BackgroundServer, build_app

    index_dir = root / name
    _cli("index", str(corpus), "-c", CONDITION, *flags, "--index-dir", str(index_dir))
    vectors = sorted(_sha(p.read_bytes()) for p in index_dir.rglob("vectors.npy"))  # folder names carry a time
    query = _cli("query", *QUERIES, "-c", CONDITION, "-k", str(K), "--json", "--index-dir", str(index_dir))
    config = ServeConfig(index_dir=index_dir, device="cpu")
    with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        response = http.post("/query", json={"queries": QUERIES, "condition": CONDITION, "k": K})
        response.raise_for_status()
        served = [answer["results"] for answer in response.json()["results"]]
    api = [
        hits.to_dicts() for hits in condsearch.open(index_dir, device="cpu").search(QUERIES, condition=CONDITION, k=K)
    ]
    served_hits = [[{"id": h["id"], "score": h["score"]} for h in answer] for answer in served]
    # the server's JSON gives scores to SCORE_PLACES decimals (condsearch.query.as_json)
    api_hits = [[{"id": h["id"], "score": round(h["score"], 6)} for h in answer] for answer in api]
    return {
        "vectors_npy_sha256": vectors,
        "query_json_sha256": _sha(query.encode()),
        "query_json": query,
        "serve_sha256": _sha(json.dumps(served, sort_keys=True).encode()),
        "api_sha256": _sha(json.dumps(api, sort_keys=True, default=str).encode()),
        "api_equals_serve": api_hits == served_hits,
        "api_serve_max_score_gap": max(
            abs(a["score"] - s["score"])
            for aa, ss in zip(api_hits, served_hits, strict=True)
            for a, s in zip(aa, ss, strict=True)
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--compare", type=Path, help="an earlier snapshot: exit 1 when anything differs")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    result: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = _demo_csv(Path(tmp))
        for name in args.variants.split(","):
            result[name] = snapshot_variant(name, VARIANTS[name], corpus, Path(tmp))
            print(
                f"{name}: {json.dumps({k: v for k, v in result[name].items() if k != 'query_json'})}", file=sys.stderr
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    keys = ("vectors_npy_sha256", "query_json_sha256", "serve_sha256")
    changed = [f"{v}.{k}" for v in result for k in keys if v in before and before[v][k] != result[v][k]]  # type: ignore[index]
    print("unchanged" if not changed else "changed: " + ", ".join(changed))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
