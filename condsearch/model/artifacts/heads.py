"""A projection head's folder: its config, checksum and whether it fits an encoder (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from condsearch.base.artifact_files import HEAD_CONFIG, HEAD_FORMAT_VERSION, HEAD_WEIGHTS, file_checksum, read_json
from condsearch.errors import ModelError


@dataclass(frozen=True)
class HeadConfig:
    """Shape and provenance of a projection head."""

    input_dim: int
    dim: int
    dropout: float = 0.15
    negative_slope: float = 0.01
    model_id: str = ""
    model_revision: str = ""
    encoder_pooling: str = ""


def has_head(folder: Path) -> bool:
    """Return whether folder holds a head's weights."""
    return (Path(folder) / HEAD_WEIGHTS).is_file()


def head_checksum(folder: Path) -> str:
    """Return the sha256 of the head's weights file."""
    return file_checksum(Path(folder) / HEAD_WEIGHTS, "head weights")


def read_head_config(folder: Path) -> HeadConfig:
    """Return the config in a head folder, checking its format version."""
    folder = Path(folder)
    meta = read_json(folder / HEAD_CONFIG, "head")
    if meta.get("format_version") != HEAD_FORMAT_VERSION:
        raise ModelError(f"{folder}: head format {meta.get('format_version')} is not supported")
    fields = set(HeadConfig.__dataclass_fields__)
    return HeadConfig(**{k: v for k, v in meta.items() if k in fields})  # type: ignore[arg-type]


def head_meta(config: HeadConfig, extra: Mapping[str, object] | None = None) -> dict[str, object]:
    """Return head.json's content for a head of this config (``extra``: how it was trained)."""
    return {"format_version": HEAD_FORMAT_VERSION, **asdict(config), **(extra or {})}


def check_head(config: HeadConfig, name: str, described: Mapping[str, object]) -> None:
    """Raise ModelError unless a head fits the encoder whose ``describe()`` is given (dims, model, pooling)."""
    model_id, dim, pooling = described.get("model_id"), described.get("dim"), described.get("pooling")
    if config.input_dim != dim:
        raise ModelError(f"head {name!r} takes {config.input_dim}-d inputs but {model_id} gives {dim}-d")
    if config.model_id and config.model_id != model_id:
        raise ModelError(f"head {name!r} was trained for {config.model_id}, not {model_id}")
    if config.encoder_pooling and pooling and config.encoder_pooling != pooling:
        raise ModelError(f"head {name!r} was trained on {config.encoder_pooling} pooling, not {pooling}")
