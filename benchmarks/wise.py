#!/usr/bin/env python3
"""Weight-space interpolation (WiSE-FT) of a ``delta`` adapter: the base model plus α times the change.

A ``delta`` adapter (``condsearch train full``, cut by ``benchmarks/lowrank.py``) stores a full
fine-tune's weight changes, each either whole (``<param>.delta``) or as two factors
(``<param>.delta_b`` @ ``<param>.delta_a``). Scaling every change by α moves the model along the
straight line from the base model (α = 0) to the fine-tuned one (α = 1): for a factored change
only ``delta_b`` is scaled, so the product is α times the original. The folder written is an
ordinary delta adapter that ``--profile FOLDER`` and ``benchmarks/csts.py --head FOLDER`` load.

    python benchmarks/wise.py --alpha 0.5 --out build/full-a0.5   # from the shipped `full` profile
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from condsearch.artifacts.files import NATIVE_ADAPTER_CONFIG as LEGACY_ADAPTER_CONFIG
from condsearch.artifacts.files import NATIVE_ADAPTER_WEIGHTS as LEGACY_ADAPTER_WEIGHTS
from condsearch.artifacts.profiles import resolve_profile

_SCALED = (".delta", ".delta_b")


def scale_delta(source: Path, alpha: float, out: Path, *, note: str = "") -> Path:
    """Write source's delta adapter with every weight change multiplied by alpha into out; return out."""
    config = json.loads((source / LEGACY_ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if config.get("kind") != "delta":
        raise SystemExit(f"{source}: not a delta adapter (kind {config.get('kind')!r})")
    state = load_file(str(source / LEGACY_ADAPTER_WEIGHTS))
    scaled = {k: (v.float() * alpha).to(v.dtype) if k.endswith(_SCALED) else v for k, v in state.items()}
    if not all(torch.isfinite(v).all() for v in scaled.values()):
        raise SystemExit(f"alpha {alpha} gives non-finite weights")
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in scaled.items()}, str(out / LEGACY_ADAPTER_WEIGHTS))
    config["source"] = [*config.get("source", []), note or f"benchmarks/wise.py --alpha {alpha} of {source.name}"]
    config.pop("dev_spearman", None)  # measured again for the scaled weights, never carried over
    config["wise_alpha"] = alpha
    (out / LEGACY_ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def shipped_delta(profile: str = "full") -> Path:
    """Return the folder of a shipped profile's delta adapter."""
    folder = resolve_profile(None, profile=profile).adapter
    if folder is None:
        raise SystemExit(f"profile {profile!r} has no adapter")
    return Path(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alpha", type=float, required=True, help="share of the fine-tune's change to keep (0..1)")
    p.add_argument("--source", type=Path, default=None, help="delta adapter folder [default: the shipped `full`]")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not 0.0 <= args.alpha <= 2.0:
        p.error("--alpha must lie in [0, 2]")
    source = args.source or shipped_delta()
    scale_delta(source, args.alpha, args.out)
    print(args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
