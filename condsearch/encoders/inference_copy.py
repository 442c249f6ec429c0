"""The cached inference copy of a BERT without torch: where it lives, its files, its tokenizer.

``bert_inference`` writes the copy (checked against transformers) and loads it into a torch
module. The copy is keyed by the model's revision, the adapter's sha256 and config, and the
transformers and torch versions. Its tokenizer (``tokenizers`` alone) and the adapter's key also
serve the ONNX exports (:mod:`condsearch.encoders.onnx_files`), which a one-shot query runs
without torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from condsearch.artifacts.adapters import read_adapter
from condsearch.cache import default_cache_dir
from condsearch.models import ModelSource

#: 2 (a key it held, whether a numpy forward pass was checked on it, is no longer written nor read)
FORMAT_VERSION = 2
WEIGHTS_FILE = "weights.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "inference.json"


class _Encoded(dict):  # type: ignore[type-arg]
    """Tokenizer output: lists per key, as transformers' BatchEncoding, with ``sequence_ids``."""

    def __init__(self, data: dict[str, list[list[int]]], encodings: list[Any]) -> None:
        super().__init__(data)
        self._encodings = encodings

    def sequence_ids(self, i: int) -> list[int | None]:
        return list(self._encodings[i].sequence_ids)


class BackendTokenizer:
    """The part of a transformers fast tokenizer that BertStyleEncoder uses, over ``tokenizers`` alone.

    A transformers fast tokenizer is this same backend plus truncation and padding set per call.
    """

    is_fast = True

    def __init__(self, backend: Any, meta: Mapping[str, Any]) -> None:
        self.backend = backend
        self.pad_token_id: int | None = meta["pad_token_id"]
        self.model_max_length = int(meta["model_max_length"])
        self.model_input_names: list[str] = list(meta["model_input_names"])
        self.truncation_side = str(meta.get("truncation_side", "right"))

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return int(self.backend.num_special_tokens_to_add(pair))

    def __call__(
        self,
        text: Sequence[str],
        text_pair: Sequence[str] | None = None,
        *,
        truncation: bool | str = False,
        max_length: int | None = None,
        add_special_tokens: bool = True,
    ) -> _Encoded:
        if truncation and max_length:
            strategy = "longest_first" if truncation is True else str(truncation)
            self.backend.enable_truncation(max_length, strategy=strategy, direction=self.truncation_side)
        else:
            self.backend.no_truncation()
        self.backend.no_padding()
        inputs = list(text) if text_pair is None else list(zip(text, text_pair, strict=True))
        encodings = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        fields = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
        data = {key: [list(getattr(e, fields[key])) for e in encodings] for key in self.model_input_names}
        return _Encoded(data, encodings)


def cache_folder(source: ModelSource, adapter_checksum: str) -> Path | None:
    """Return where the inference copy of a model (with an adapter merged) lives, or None if unsafe to cache.

    A hub model that is not in the local cache resolves to revision 'main', which names no weights.
    """
    if source.revision == "main":
        return None
    try:
        transformers_version = importlib.metadata.version("transformers")
        torch_version = importlib.metadata.version("torch")  # torch.__version__, without importing it
    except importlib.metadata.PackageNotFoundError:
        return None
    key = json.dumps(
        [FORMAT_VERSION, source.model_id, source.revision, adapter_checksum, transformers_version, torch_version]
    )
    return default_cache_dir() / "bert-inference" / hashlib.sha256(key.encode()).hexdigest()[:24]


def adapter_key(folder: Path) -> str:
    """Return what identifies an adapter's merged effect: its checksum and its shape (kind, rank, alpha)."""
    return read_adapter(folder).key


def read_meta(folder: Path) -> dict[str, Any] | None:
    """Return the copy's config file if it is there and of this format, else None (a cache miss)."""
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format_version") == FORMAT_VERSION else None


def read_tokenizer(folder: Path, meta: Mapping[str, Any]) -> BackendTokenizer:
    """Return the copy's tokenizer (``tokenizers`` alone)."""
    from tokenizers import Tokenizer

    return BackendTokenizer(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), meta["tokenizer"])
