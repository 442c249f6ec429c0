"""BERT-style encoders for inference without importing transformers: a cached, merged copy.

Importing transformers' model code costs seconds (it pulls in torch.distributed, dynamo and
scipy), several times the work of one query. The first time a BERT model (with its LoRA adapter
merged, if any) is loaded for inference, it is loaded through transformers as usual, checked
against a plain-torch forward pass of the same weights, and written to the cache as
safetensors weights + the tokenizer's own ``tokenizer.json`` + a JSON config. Later loads read
that copy with ``tokenizers``, ``safetensors`` and torch alone. The copy is keyed by the model's
revision, the adapter's sha256 and the transformers version; one that is unreadable is only a
cache miss.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from condsearch.atomic import swap_dir
from condsearch.encoders.inference_copy import (
    CONFIG_FILE,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    BackendTokenizer,
    adapter_key,
    cache_folder,
    read_meta,
    read_tokenizer,
)
from condsearch.models import ModelSource

if TYPE_CHECKING:
    from condsearch.encoders.bert import BertStyleEncoder

log = logging.getLogger(__name__)

_CONFIG_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "model_type",
)
#: how far the plain forward pass may stray from transformers' before the copy is refused
_TOLERANCE = 1e-4


def supports(config: Mapping[str, object]) -> bool:
    """Return whether a model config is a plain BERT encoder that :class:`PlainBert` computes exactly."""
    return (
        config.get("model_type") == "bert"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and config.get("hidden_act", "gelu") == "gelu"
        and not config.get("is_decoder")
        and not config.get("add_cross_attention")
        and "auto_map" not in config  # custom code
    )


class _Module(nn.Module):
    """A named container, so that parameter names match transformers' BertModel."""

    def __getattr__(self, name: str) -> Any:  # submodules are set by name: tell the type checker so
        return super().__getattr__(name)


class _Layer(nn.Module):
    def __init__(self, c: SimpleNamespace) -> None:
        super().__init__()
        h, eps = c.hidden_size, c.layer_norm_eps
        self.n_heads = c.num_attention_heads
        self.attention = _Module()
        self.attention.self = _Module()
        for name in ("query", "key", "value"):
            setattr(self.attention.self, name, nn.Linear(h, h, device="meta"))
        self.attention.output = _Module()
        self.attention.output.dense = nn.Linear(h, h, device="meta")
        self.attention.output.LayerNorm = nn.LayerNorm(h, eps=eps, device="meta")
        self.intermediate = _Module()
        self.intermediate.dense = nn.Linear(h, c.intermediate_size, device="meta")
        self.output = _Module()
        self.output.dense = nn.Linear(c.intermediate_size, h, device="meta")
        self.output.LayerNorm = nn.LayerNorm(h, eps=eps, device="meta")

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        att = self.attention.self

        def heads(t: torch.Tensor) -> torch.Tensor:  # (b, n, h) -> (b, heads, n, h / heads)
            return t.view(b, n, self.n_heads, h // self.n_heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(heads(att.query(x)), heads(att.key(x)), heads(att.value(x)), mask)
        ctx = ctx.transpose(1, 2).reshape(b, n, h)
        x = self.attention.output.LayerNorm(self.attention.output.dense(ctx) + x)
        return self.output.LayerNorm(self.output.dense(F.gelu(self.intermediate.dense(x))) + x)


class PlainBert(nn.Module):
    """BERT's encoder (no pooler) in plain torch, with transformers' parameter names.

    Built empty (on the meta device, so nothing is initialised); :meth:`load` assigns the weights.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        c = SimpleNamespace(**{k: config[k] for k in _CONFIG_KEYS})
        self.config = c
        h = c.hidden_size
        self.embeddings = _Module()
        for name, rows in (
            ("word_embeddings", c.vocab_size),
            ("position_embeddings", c.max_position_embeddings),
            ("token_type_embeddings", c.type_vocab_size),
        ):
            # a given weight skips initialisation (normal_ on the meta device imports torch._decomp: seconds)
            setattr(self.embeddings, name, nn.Embedding(rows, h, _weight=torch.empty(rows, h, device="meta")))
        self.embeddings.LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps, device="meta")
        self.encoder = _Module()
        self.encoder.layer = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))

    def load(self, state: Mapping[str, torch.Tensor]) -> PlainBert:
        """Assign the weights (every parameter, nothing else) and switch to inference; return self."""
        self.load_state_dict(state, strict=True, assign=True)
        self.requires_grad_(False)
        return self.eval()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> SimpleNamespace:
        """Return ``last_hidden_state``: (batch, tokens, hidden), as transformers' BertModel does."""
        e = self.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        x = e.word_embeddings(input_ids) + e.token_type_embeddings(types) + e.position_embeddings(positions)
        x = e.LayerNorm(x)
        mask = attention_mask.bool()[:, None, None, :]  # keys that are real tokens
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return SimpleNamespace(last_hidden_state=x)


def load_copy(folder: Path) -> tuple[BackendTokenizer, PlainBert] | None:
    """Return (tokenizer, model on the CPU) from a cached copy, or None if there is none or it is unreadable."""
    meta = read_meta(folder)
    if meta is None:
        return None
    try:
        model = PlainBert(meta["config"]).load(load_file(str(folder / WEIGHTS_FILE)))
        tokenizer = read_tokenizer(folder, meta)
    except Exception as exc:  # noqa: BLE001 - a damaged copy is only a cache miss
        log.info("ignoring the cached inference copy in %s (%s)", folder, type(exc).__name__)
        return None
    return tokenizer, model


def _probe(tokenizer: Any, model: nn.Module, device: torch.device) -> torch.Tensor:
    enc = tokenizer(["a probe sentence, with a comma", "short"], ["the condition", "another one"], truncation=True)
    width = max(len(ids) for ids in enc["input_ids"])
    batch = {
        k: torch.tensor([row + [0] * (width - len(row)) for row in rows], device=device) for k, rows in enc.items()
    }
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state.float()
    return hidden * batch["attention_mask"].unsqueeze(-1)


def as_plain(model: nn.Module) -> PlainBert | None:
    """Return a PlainBert (CPU, float32) holding a loaded transformers BERT's weights, or None if they do not fit.

    Only the names and shapes are checked here; whether it computes the same is for the caller to check.
    """
    config = {k: getattr(model.config, k, None) for k in _CONFIG_KEYS}
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    try:
        plain = PlainBert(config)
        wanted = set(plain.state_dict())
        return plain.load({k: v for k, v in state.items() if k in wanted})
    except (RuntimeError, TypeError) as exc:  # names or shapes differ: not the architecture PlainBert computes
        log.info("PlainBert does not compute this model (%s)", exc)
        return None


def save_copy(folder: Path, tokenizer: Any, model: nn.Module) -> bool:
    """Write the inference copy of a loaded transformers BERT (tokenizer + model) if PlainBert agrees with it.

    Returns whether it was written. Another process writing the same copy at once is harmless.
    """
    device = next(model.parameters()).device
    plain = as_plain(model)
    if plain is None:
        return False
    config = vars(plain.config)
    state = dict(sorted(plain.state_dict().items()))  # on the CPU, before plain moves to the model's device
    gap = (_probe(tokenizer, model, device) - _probe(tokenizer, plain.to(device), device)).abs().max().item()
    if not gap <= _TOLERANCE:
        log.info("no inference copy of this model: the plain forward pass differs by %.3g", gap)
        return False
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a copy: the loaded one stays as it is
    backend.no_truncation()
    backend.no_padding()
    meta = {
        "format_version": FORMAT_VERSION,
        "config": config,
        "tokenizer": {
            "pad_token_id": tokenizer.pad_token_id,
            "model_max_length": int(min(tokenizer.model_max_length, 1 << 30)),
            "model_input_names": list(tokenizer.model_input_names),
            "truncation_side": tokenizer.truncation_side,
        },
    }
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            (tmp / TOKENIZER_FILE).write_text(backend.to_str())
            save_file(state, str(tmp / WEIGHTS_FILE))
            (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            swap_dir(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        log.info("could not cache the inference copy in %s (%s)", folder, exc)
        return False
    return True


def load_for_inference(
    source: ModelSource,
    *,
    device: str | None,
    max_length: int | None,
    adapter: Path | None,
) -> BertStyleEncoder:
    """Return a BERT-style encoder for inference (adapter merged), from the cached copy when there is one.

    Without one, the model is loaded through transformers and the copy written for next time.
    """
    from condsearch.artifacts.adapters import checked_checksum
    from condsearch.encoders.bert import BertStyleEncoder
    from condsearch.encoders.lora import apply_adapter

    folder = cache_folder(source, adapter_key(adapter) if adapter is not None else "")
    loaded = load_copy(folder) if folder is not None else None
    if loaded is not None:
        encoder = BertStyleEncoder(source, device=device, max_length=max_length, loaded=loaded)
        if adapter is not None:
            encoder.adapter_checksum = checked_checksum(adapter, encoder)
        return encoder
    encoder = BertStyleEncoder(source, device=device, max_length=max_length)
    if adapter is not None:
        apply_adapter(encoder, adapter)
    if folder is not None and save_copy(folder, encoder.tokenizer, encoder.model):
        log.info("cached an inference copy of %s in %s", source.model_id, folder)
    return encoder
