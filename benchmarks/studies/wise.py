#!/usr/bin/env python3
"""Weight-space interpolation (WiSE-FT) of a ``delta`` adapter: the base model plus α times the change.

A ``delta`` adapter (``condsearch train full``, cut by ``benchmarks/studies/lowrank.py``) stores a full
fine-tune's weight changes, each either whole (``<param>.delta``) or as two factors
(``<param>.delta_b`` @ ``<param>.delta_a``). Scaling every change by α moves the model along the
straight line from the base model (α = 0) to the fine-tuned one (α = 1): for a factored change
only ``delta_b`` is scaled, so the product is α times the original. The folder written is an
ordinary delta adapter that ``--profile FOLDER`` and ``benchmarks/paper/csts.py --head FOLDER`` load.

``--router FOLDER`` does the same to a context router (ours): its backbone change, stored compactly
or whole, is decoded, scaled and written at float32, each tensor whole or as its two factors (20 MB
for the shipped router: a measuring artifact, not one to ship). ``--mode csr --router OUT`` loads it.

    python -m benchmarks.studies.wise --alpha 0.5 --out build/full-a0.5   # from the shipped `full` profile
    python -m benchmarks.studies.wise --alpha 0.75 --router default --out build/csr-a0.75   # the shipped router

``--smoke`` scales a made-up delta adapter (one change whole, one as two factors, 8 x 8) at α 0.5
(or --alpha) into a temporary folder (or --out), checks every written tensor against α times the
source, and with --router also scales that router; ``--json-out`` records the checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from benchmarks._lib.common import exit_code, run_info, write_json  # noqa: E402
from condsearch.base.artifact_files import NATIVE_ADAPTER_CONFIG as LEGACY_ADAPTER_CONFIG
from condsearch.base.artifact_files import NATIVE_ADAPTER_WEIGHTS as LEGACY_ADAPTER_WEIGHTS
from condsearch.base.artifact_files import ROUTER_CONFIG, ROUTER_WEIGHTS
from condsearch.model.artifacts.profiles import resolve_profile
from condsearch.model.artifacts.routers import WEIGHTS_RECORD, read_router_config, weights_record

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
    note = note or f"benchmarks/studies/wise.py --alpha {alpha} of {source.name}"
    config["source"] = [*config.get("source", []), note]
    config.pop("dev_spearman", None)  # measured again for the scaled weights, never carried over
    config["wise_alpha"] = alpha
    (out / LEGACY_ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def scale_router(source: Path, alpha: float, out: Path, model: str | None = None) -> Path:
    """Write source's context router with its backbone change multiplied by alpha into out; return out."""
    from condsearch.base.model_sources import resolve_model
    from condsearch.model.csr.compact_delta import decode
    from condsearch.model.csr.context_weights import base_weights

    meta = read_router_config(source)
    config = meta.get("router_config")
    if not isinstance(config, dict) or config.get("variant") != "context":
        raise SystemExit(f"{source}: not a context router (the paper and extended routers hold no backbone change)")
    recorded = meta.get("model_id")
    base = base_weights(resolve_model(model or (str(recorded) if recorded else None)).location)
    change = decode(load_file(str(source / ROUTER_WEIGHTS)), {n: tuple(p.shape) for n, p in base.items()})
    scaled = {k: (v.float() * alpha if k.endswith(_SCALED) else v.float()).contiguous() for k, v in change.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(scaled, str(out / ROUTER_WEIGHTS))
    bytes_ = sum(t.numel() * t.element_size() for t in scaled.values())
    meta["backbone_delta"] = {
        **dict(meta.get("backbone_delta") or {}),
        "rank": None,
        "encoding": "decoded",  # float32: each change whole or as its float factors, as decode gives them
        "bytes": bytes_,
    }
    meta["wise_alpha"] = alpha
    meta[WEIGHTS_RECORD] = weights_record(out)  # the source's record is not these weights'
    meta["source"] = f"benchmarks/studies/wise.py --router {source} --alpha {alpha}"
    (out / ROUTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def shipped_router() -> Path:
    """Return the folder of the shipped context router."""
    folder = resolve_profile(None, mode="csr").router
    if folder is None:
        raise SystemExit("no shipped router")
    return Path(folder)


def shipped_delta(profile: str = "full") -> Path:
    """Return the folder of a shipped profile's delta adapter."""
    folder = resolve_profile(None, profile=profile).adapter
    if folder is None:
        raise SystemExit(f"profile {profile!r} has no adapter")
    return Path(folder)


def made_up_delta(folder: Path, seed: int = 0) -> Path:
    """Write a tiny delta adapter for --smoke: one change whole, one as two factors, and a tensor kept as is."""
    g = torch.Generator().manual_seed(seed)
    state = {
        "encoder.layer.0.attention.self.query.weight.delta": torch.randn(8, 8, generator=g),
        "encoder.layer.0.output.dense.weight.delta_b": torch.randn(8, 2, generator=g),
        "encoder.layer.0.output.dense.weight.delta_a": torch.randn(2, 8, generator=g),
        "head.weight": torch.randn(4, 8, generator=g),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / LEGACY_ADAPTER_WEIGHTS))
    config = {"kind": "delta", "source": ["benchmarks/studies/wise.py --smoke"], "dev_spearman": 0.5}
    (folder / LEGACY_ADAPTER_CONFIG).write_text(json.dumps(config) + "\n", encoding="utf-8")
    return folder


def check_scaled(source: Path, alpha: float, out: Path) -> dict[str, object]:
    """Compare out's delta adapter with alpha times source's change; raise SystemExit where they differ."""
    before, after = load_file(str(source / LEGACY_ADAPTER_WEIGHTS)), load_file(str(out / LEGACY_ADAPTER_WEIGHTS))
    if set(before) != set(after):
        raise SystemExit(f"{out}: tensors {sorted(set(before) ^ set(after))} added or lost")
    worst = 0.0
    for name, tensor in before.items():
        want = tensor.float() * alpha if name.endswith(_SCALED) else tensor.float()
        worst = max(worst, float((after[name].float() - want).abs().max()))
    config = json.loads((out / LEGACY_ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if worst > 1e-6 or config.get("wise_alpha") != alpha or "dev_spearman" in config:
        raise SystemExit(f"{out}: not alpha {alpha} times {source}'s change (largest error {worst})")
    return {"tensors": len(before), "max_abs_error": worst, "wise_alpha": alpha}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alpha", type=float, default=None, help="share of the fine-tune's change to keep (0..1)")
    p.add_argument("--source", type=Path, default=None, help="delta adapter folder [default: the shipped `full`]")
    p.add_argument(
        "--router", default=None, help="scale this context router folder instead ('default': the shipped one)"
    )
    p.add_argument("--model", default=None, help="the router's base model [default: the one it records]")
    p.add_argument("--out", type=Path, default=None, help="folder written (required but in --smoke)")
    p.add_argument("--smoke", action="store_true", help="scale a made-up 8 x 8 delta adapter and check it (seconds)")
    p.add_argument("--json-out", type=Path, default=None, help="--smoke: the checks as JSON")
    args = p.parse_args(argv)
    if args.smoke:
        return smoke(args)
    if args.alpha is None or args.out is None:
        p.error("--alpha and --out are required (or --smoke)")
    if not 0.0 <= args.alpha <= 2.0:
        p.error("--alpha must lie in [0, 2]")
    if args.router is not None and args.source is not None:
        p.error("--router and --source: name one")
    if args.router is not None:
        source = shipped_router() if args.router == "default" else Path(args.router)
        scale_router(source, args.alpha, args.out, args.model)
    else:
        scale_delta(args.source or shipped_delta(), args.alpha, args.out)
    print(args.out, file=sys.stderr)
    return 0


def smoke(args: argparse.Namespace) -> int:
    """Scale a made-up delta adapter (and --router's router, if named) and check the delta's arithmetic."""
    alpha = 0.5 if args.alpha is None else args.alpha
    with tempfile.TemporaryDirectory(prefix="wise-smoke-") as tmp:
        out = args.out or Path(tmp) / "out"
        source = args.source or made_up_delta(Path(tmp) / "made-up")
        scale_delta(source, alpha, out / "delta")
        result: dict[str, object] = {"smoke": True, "delta": check_scaled(source, alpha, out / "delta")}
        if args.router is not None:
            router = shipped_router() if args.router == "default" else Path(args.router)
            scaled = scale_router(router, alpha, out / "router", args.model)
            result["router"] = {"source": str(router), "bytes": read_router_config(scaled)["backbone_delta"]["bytes"]}
        result["run"] = run_info("cpu")
        write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "wise.py"))
