"""Running an ONNX export without torch: onnxruntime sessions, the export's tokenizer, runs of like length.

Every export (CASE's encoder, :mod:`condsearch.model.encoders.onnx.bert`; the router's passes,
:mod:`condsearch.model.csr.onnx_run`) is read here with onnxruntime, ``tokenizers`` and numpy alone, so
that a one-shot query runs one without importing torch, and bulk work runs the same code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from condsearch.errors import ModelError
from condsearch.model.encoders.onnx.cache import TOKENIZER_FILE

log = logging.getLogger(__name__)

#: what an export is read into: CASE's encoder, the router's passes
Runner = TypeVar("Runner")

#: a tokenized batch's inputs, as a tokenizer names them (and a BERT-style graph takes them)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: rows per onnxruntime run: a batch runs as runs of this many rows of like token length, each
#: padded only to its own longest (:func:`runs`). On 512 C-STS dev pairs (about 24 tokens, batches
#: of 64 sorted by characters, 2 loaded cores) CASE's int8 went 306 -> 464 pairs/s and its float32
#: export 160 -> 196 (issue 28, benchmarks/systems/results/int8_study.json): less padding (1.20 ->
#: about 1.04 tokens per real token), and smaller activations (batches of 16 alone gave most of it;
#: runs of 8 or 32 did no better: benchmarks/systems/results/int8_study_runs.json)
RUN_ROWS = 16


class _Encoded(dict):  # type: ignore[type-arg]
    """Tokenizer output: lists per key, as transformers' BatchEncoding, with ``sequence_ids``."""

    def __init__(self, data: dict[str, list[list[int]]], encodings: list[Any]) -> None:
        super().__init__(data)
        self._encodings = encodings

    def sequence_ids(self, i: int) -> list[int | None]:
        return list(self._encodings[i].sequence_ids)


class BackendTokenizer:
    """The part of a transformers fast tokenizer that CASE's inputs use, over ``tokenizers`` alone.

    :mod:`condsearch.model.encoders.bert_inputs` reads it (CASE's pairs, the router's sentences). A transformers
    fast tokenizer is this same backend plus truncation and padding set per call; as there, the settings
    are the backend's, so calls run one at a time (:mod:`condsearch.model.encoders.serial_tokenizer`).
    """

    is_fast = True

    def __init__(self, backend: Any, meta: Mapping[str, Any]) -> None:
        self.backend = backend
        self.pad_token_id: int | None = meta["pad_token_id"]
        self.model_max_length = int(meta["model_max_length"])
        self.model_input_names: list[str] = list(meta["model_input_names"])
        self.truncation_side = str(meta.get("truncation_side", "right"))
        self._lock = threading.Lock()

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
        inputs = list(text) if text_pair is None else list(zip(text, text_pair, strict=True))
        with self._lock:
            if truncation and max_length:
                strategy = "longest_first" if truncation is True else str(truncation)
                self.backend.enable_truncation(max_length, strategy=strategy, direction=self.truncation_side)
            else:
                self.backend.no_truncation()
            self.backend.no_padding()
            encodings = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        fields = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
        data = {key: [list(getattr(e, fields[key])) for e in encodings] for key in self.model_input_names}
        return _Encoded(data, encodings)


def read_tokenizer(folder: Path, meta: Mapping[str, Any]) -> BackendTokenizer | None:
    """Return the tokenizer an export carries (its files checked), or None if it has none or it is unreadable."""
    settings = meta.get("tokenizer")
    if not isinstance(settings, dict):
        return None
    try:
        from tokenizers import Tokenizer

        return BackendTokenizer(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), settings)
    except Exception as exc:  # noqa: BLE001 - a damaged export is only a cache miss
        log.info("ignoring the tokenizer of the ONNX export in %s (%s)", folder, type(exc).__name__)
        return None


def open_session(path: Path, threads: int) -> Any:
    """Return an onnxruntime session of the graph at path on the CPU, on ``threads`` intra-op threads."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ModelError("the ONNX encoder needs onnxruntime: pip install onnxruntime") from None

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Its idle threads would otherwise spin after each run, on the cores FAISS searches with next
    # (a served query's search took 20 ms beside them instead of 7; benchmarks/README, issue 28).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def open_export(
    folder: Path, graphs: Sequence[str], threads: int, build: Callable[[list[Any]], Runner]
) -> Runner | None:
    """Return ``build(sessions)`` of an export whose files were checked: a session of each of its graphs, in order.

    None where onnxruntime cannot read a graph or build finds its meta file wanting: a damaged export
    is only a cache miss (said at info level). A missing onnxruntime is a one-line ModelError.
    """
    try:
        return build([open_session(folder / name, threads) for name in graphs])
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged export is only a cache miss
        log.info("ignoring the ONNX export in %s (%s)", folder, type(exc).__name__)
        return None


def runs(lengths: np.ndarray, rows: int) -> Iterator[tuple[np.ndarray, int]]:
    """Yield (row indices, width): a right-padded batch's rows in runs of ``rows`` (0: all) of like length.

    Longest first (a stable sort), each run cut to its own longest row (at least 1 token), so that
    a run loses only padding. This changes float32 outputs by rounding only, int8 ones by their
    activation scales (one per run).
    """
    order = np.argsort(-lengths, kind="stable")
    step = rows if rows > 0 else max(len(order), 1)
    for start in range(0, len(order), step):
        run = order[start : start + step]
        yield run, max(int(lengths[run].max()), 1)
