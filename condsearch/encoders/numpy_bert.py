"""BERT's forward pass in numpy, over the cached inference copy: a one-shot query without ``import torch``.

Importing torch costs 1.5–3 s here, while a few queries' forward pass through a MiniLM takes
milliseconds. ``bert_inference`` writes the copy (adapter merged) only after checking this
forward pass against transformers' within its tolerance, and marks it so; a copy not so marked
is not used here. Everything runs in float32 on the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from condsearch.encoders.base import Encoder, Pair
from condsearch.encoders.bert_inputs import case_inputs, max_length_for
from condsearch.encoders.inference_copy import (
    CHECKED_KEY,
    WEIGHTS_FILE,
    adapter_key,
    cache_folder,
    read_meta,
    read_tokenizer,
)
from condsearch.models import ModelSource

log = logging.getLogger(__name__)


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below float32's resolution near 1); numpy has no erf
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray) -> np.ndarray:
    """Return the exact (erf) GELU that BERT uses, elementwise."""
    return (0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))).astype(np.float32, copy=False)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """Normalise the last axis to zero mean and unit variance, then scale and shift."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + np.float32(eps)) * weight + bias).astype(np.float32, copy=False)


class NumpyBert:
    """BERT's encoder (no pooler) over weights named as transformers' BertModel names them."""

    def __init__(self, config: Mapping[str, object], weights: Mapping[str, np.ndarray]) -> None:
        self.config = SimpleNamespace(**config)
        self.w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}
        self.hidden_size = int(self.config.hidden_size)
        self.n_heads = int(self.config.num_attention_heads)
        self.n_layers = int(self.config.num_hidden_layers)
        self.eps = float(self.config.layer_norm_eps)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray | None = None
    ) -> np.ndarray:
        """Return the last hidden states: (batch, tokens, hidden) float32; inputs are (batch, tokens) ints."""
        b, n = input_ids.shape
        types = token_type_ids if token_type_ids is not None else np.zeros_like(input_ids)
        e = "embeddings"
        x = (
            self.w[f"{e}.word_embeddings.weight"][input_ids]
            + self.w[f"{e}.token_type_embeddings.weight"][types]
            + self.w[f"{e}.position_embeddings.weight"][:n]
        )
        x = self._norm(x, f"{e}.LayerNorm")
        # pads are keys no query attends to: their scores become -inf before the softmax
        blocked = np.where(attention_mask.astype(bool), 0.0, -np.inf).astype(np.float32)[:, None, None, :]
        d = self.hidden_size // self.n_heads
        scale = np.float32(1.0 / np.sqrt(d))

        def heads(t: np.ndarray) -> np.ndarray:  # (b, n, h) -> (b, heads, n, d)
            return t.reshape(b, n, self.n_heads, d).transpose(0, 2, 1, 3)

        for i in range(self.n_layers):
            p = f"encoder.layer.{i}"
            q = heads(self._linear(x, f"{p}.attention.self.query"))
            k = heads(self._linear(x, f"{p}.attention.self.key"))
            v = heads(self._linear(x, f"{p}.attention.self.value"))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + blocked
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            ctx = (scores / scores.sum(axis=-1, keepdims=True)) @ v
            ctx = ctx.transpose(0, 2, 1, 3).reshape(b, n, self.hidden_size)
            x = self._norm(self._linear(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            inner = gelu(self._linear(x, f"{p}.intermediate.dense"))
            x = self._norm(self._linear(inner, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        return x.astype(np.float32, copy=False)


class NumpyBertEncoder(Encoder):
    """:class:`~condsearch.encoders.bert.BertStyleEncoder`'s vectors (condition-mean pooling) from numpy.

    Its ``describe()`` equals the torch encoder's for the same model, adapter and token limit.
    """

    pooling = "condition-mean"

    def __init__(
        self, source: ModelSource, tokenizer: object, model: NumpyBert, max_length: int, adapter_checksum: str = ""
    ) -> None:
        super().__init__()
        self.tokenizer, self.model = tokenizer, model
        self.model_id, self.revision = source.model_id, source.revision
        self.dim = model.hidden_size
        self.max_length = max_length
        self.adapter_checksum = adapter_checksum

    def describe(self) -> dict[str, object]:
        info = {**super().describe(), "pooling": self.pooling, "max_length": self.max_length}
        if self.adapter_checksum:
            info["adapter_checksum"] = self.adapter_checksum
        return info

    def embed_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        batch, pool = case_inputs(self.tokenizer, pairs, self.max_length, self.stats)
        # Waking BLAS threads for matrices this small costs more than the products, and on a busy
        # machine far more (1.3 s instead of 0.05 s for one query's 72 products here).
        with threadpool_limits(limits=1, user_api="blas"):
            hidden = self.model.forward(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        summed = (hidden * pool[:, :, None]).sum(axis=1)
        return (summed / np.maximum(pool.sum(axis=1, keepdims=True), 1.0)).astype(np.float32)


def load_numpy_encoder(source: ModelSource, *, max_length: int | None, adapter: Path | None) -> NumpyBertEncoder | None:
    """Return the numpy encoder from the model's checked inference copy (adapter merged), or None if there is none.

    None is a cache miss: the torch path (``bert_inference.load_for_inference``) loads the model
    and writes the copy for next time.
    """
    from safetensors.numpy import load_file

    from condsearch.finetune.adapter_files import adapter_checksum, check_adapter

    folder = cache_folder(source, adapter_key(adapter) if adapter is not None else "")
    meta = read_meta(folder) if folder is not None else None
    if folder is None or meta is None or not meta.get(CHECKED_KEY):
        return None
    try:
        model = NumpyBert(meta["config"], load_file(str(folder / WEIGHTS_FILE)))
        tokenizer = read_tokenizer(folder, meta)
    except Exception as exc:  # noqa: BLE001 - a damaged copy is only a cache miss
        log.info("ignoring the cached inference copy in %s (%s)", folder, type(exc).__name__)
        return None
    limit = max_length_for(source.location, tokenizer.model_max_length, max_length, model.config)
    encoder = NumpyBertEncoder(source, tokenizer, model, limit)
    if adapter is not None:
        check_adapter(encoder, adapter)
        encoder.adapter_checksum = adapter_checksum(adapter)
    return encoder
