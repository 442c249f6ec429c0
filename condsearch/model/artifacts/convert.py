"""Convert a LoRA adapter folder of condsearch's first format to PEFT's.

Run as ``python -m condsearch.model.artifacts.convert``.

The tensors are the same numbers under PEFT's names (no torch needed); the head files beside the
adapter are copied unchanged. The new sidecar records the old weights' sha256 as the adapter's
identity (``converted_from``), so indexes built with the old folder still load, for as long as
the new weights file is the one the conversion wrote.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

from condsearch.base.artifact_files import (
    HEAD_CONFIG,
    HEAD_WEIGHTS,
    NATIVE_ADAPTER_FORMAT_VERSION,
    PEFT_WEIGHTS,
    check_own_artifact,
    file_checksum,
)
from condsearch.errors import CondsearchError, ModelError, first_line
from condsearch.model.artifacts.adapters import (
    LORA_KIND,
    adapter_checksum,
    lora_factors,
    peft_names,
    read_adapter,
    write_lora_meta,
)
from condsearch.model.artifacts.weights import load_weights

#: adapter.json's keys that PEFT's config and the sidecar's own fields hold instead
_MOVED = ("format_version", "kind", "rank", "alpha", "dropout", "targets")


def convert_legacy_adapter(source: Path, target: Path | None = None) -> str:
    """Write the format-1 LoRA adapter in source (and its head) to target in PEFT's format; return its checksum.

    ``target`` None converts in place (atomically). The result is read back and checked to hold
    the same tensors and the same identity as the source.
    """
    from safetensors.numpy import save_file

    from condsearch.base.atomic import replacing_dir

    old = read_adapter(source)
    if old.format_version != NATIVE_ADAPTER_FORMAT_VERSION or old.kind != LORA_KIND or old.lora is None:
        raise ModelError(f"{source}: not a LoRA adapter of condsearch's first format")
    check_own_artifact(Path(target or source), "adapter")
    factors = lora_factors(old, load_weights(old.weights, "adapter weights", framework="numpy"))
    identity = old.checksum
    provenance = {k: v for k, v in old.meta.items() if k not in _MOVED}
    with replacing_dir(Path(target or source), kind="adapter") as tmp:
        save_file(peft_names(factors), str(tmp / PEFT_WEIGHTS), metadata={"format": "pt"})
        converted = {"adapter_checksum": identity, "weights_sha256": file_checksum(tmp / PEFT_WEIGHTS, "adapter")}
        write_lora_meta(tmp, old.lora, sorted(factors), {**provenance, "converted_from": converted})
        for name in (HEAD_CONFIG, HEAD_WEIGHTS):
            if (Path(source) / name).is_file():
                shutil.copy2(Path(source) / name, tmp / name)
        new = read_adapter(tmp)
        again = lora_factors(new, load_weights(new.weights, "adapter weights", framework="numpy"))
        same = set(again) == set(factors) and all(
            np.array_equal(again[m][i], factors[m][i]) for m in factors for i in (0, 1)
        )
        if not same or new.lora != old.lora or new.checksum != identity:
            raise ModelError(f"{source}: the converted adapter does not read back as the original")
    return adapter_checksum(Path(target or source))


def main(argv: list[str] | None = None) -> int:
    """Convert SOURCE (in place, or into TARGET); print the adapter's checksum."""
    parser = argparse.ArgumentParser(prog="python -m condsearch.model.artifacts.convert", description=main.__doc__)
    parser.add_argument("source", type=Path, help="a LoRA adapter folder with adapter.json + adapter.safetensors")
    parser.add_argument("target", type=Path, nargs="?", default=None, help="where to write it [default: in place]")
    args = parser.parse_args(argv)
    try:
        print(convert_legacy_adapter(args.source, args.target))
    except (CondsearchError, OSError) as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
