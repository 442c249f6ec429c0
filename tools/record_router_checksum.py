"""Record the size and sha256 of router.safetensors in each router folder's router.json (issue 37).

python tools/record_router_checksum.py FOLDER [FOLDER ...]

For a router folder written before router.json held them. A folder is recorded only once its router
loads on the model it names, with every shape check passing (the recorded rank, encoding, tensor
count and bytes of a context router's change; the tensors a paper/extended router's config makes),
so that the record vouches for weights that fit. A folder that records them already is checked, not
rewritten; a mismatch there is an error, never overwritten. Nothing else in router.json changes.
Exit 0 when every folder records matching weights, 1 otherwise (one line on stderr per failure).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path


def record(folder: Path) -> str:
    """Check a router folder and record its weights' size and sha256 in its router.json; return what was done."""
    from condsearch.base.artifact_files import ROUTER_CONFIG
    from condsearch.base.atomic import replacing_file
    from condsearch.model.artifacts.routers import (
        WEIGHTS_RECORD,
        checked_router_checksum,
        read_router_config,
        router_model_id,
        weights_record,
    )
    from condsearch.model.csr import load_csr_encoder

    meta = read_router_config(folder)
    if WEIGHTS_RECORD in meta:
        return f"records sha256 {checked_router_checksum(folder, meta)[:12]} already, and it matches"
    logging.getLogger("condsearch.model.artifacts.routers").setLevel(logging.ERROR)  # its "records no sha256" notice
    with tempfile.TemporaryDirectory() as cache:  # loading writes nothing there; it must not touch the real cache
        load_csr_encoder(router_model_id(folder), router=str(folder), device="cpu", cache_dir=Path(cache))
    raw = json.loads((folder / ROUTER_CONFIG).read_text())
    raw[WEIGHTS_RECORD] = weights_record(folder)
    with replacing_file(folder / ROUTER_CONFIG) as tmp:
        tmp.write_text(json.dumps(raw, indent=2) + "\n")
    return f"recorded sha256 {str(raw[WEIGHTS_RECORD]['sha256'])[:12]}"


def main(argv: list[str]) -> int:
    from condsearch.errors import CondsearchError

    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    failed = 0
    for name in argv:
        folder = Path(name)
        try:
            print(f"{folder}: {record(folder)}")
        except CondsearchError as exc:
            print(f"{folder}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
