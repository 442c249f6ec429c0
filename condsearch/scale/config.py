"""Settings of the scale-out paths, apart from their engines so that the CLI reads them without importing any."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from condsearch.errors import CondsearchError

LOCAL = "local"  # --ray without an address: start a Ray instance on this machine


@dataclass(frozen=True)
class RayConfig:
    """Where and how wide Ray encodes."""

    address: str = LOCAL  # "local", "auto", "ray://HOST:PORT" or "HOST:PORT"
    actors: int | None = None  # encoder replicas [default: one per GPU, else one per CPU]
    batch_rows: int = 256  # rows an actor encodes per call (each under every condition)
    work_dir: Path | None = None  # shards' folder, seen by every node [default: <index dir>/.ray-work]


def check_address(address: str) -> str:
    """Return a --ray address if it has a shape Ray takes; raise CondsearchError otherwise."""
    if address in (LOCAL, "auto") or address.startswith("ray://"):
        return address
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        return address
    raise CondsearchError(
        f"--ray {address!r}: give 'auto', ray://HOST:PORT or HOST:PORT (--ray alone, after CORPUS: a local instance)"
    )
