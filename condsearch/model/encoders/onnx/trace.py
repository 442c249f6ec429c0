"""The ONNX exports' tracing source: BERT's encoder in plain torch, with transformers' weights.

transformers' ``BertModel`` traces (``torch.onnx``, TorchScript) to a graph whose outputs differ
from its own on padded batches (its attention-mask handling; checked with transformers 5.24, eager
and sdpa alike), so an export traces :class:`PlainBert`, built from the same weights, instead:
CASE's whole encoder (:class:`LastHidden`, :mod:`condsearch.model.encoders.onnx.bert`) and the router's
two passes, which run its parts (:meth:`PlainBert.embed`, a layer's ``self_context`` and ``finish``;
:mod:`condsearch.model.csr.onnx`). Torch inference runs transformers' model and CPU inference the export,
with one exception: a re-index on a CPU kind that routes in bfloat16 runs the router's passes on these
modules in torch (:mod:`condsearch.model.csr.plain_copy`), without importing transformers. Every export,
and that copy, is checked against the torch model before use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

#: what PlainBert reads of a model config (a plain copy records them: condsearch.model.csr.plain_copy)
CONFIG_KEYS = (
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


def heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(b, n, hidden) -> (b, heads, n, hidden / heads)."""
    b, n, h = t.shape
    return t.view(b, n, n_heads, h // n_heads).transpose(1, 2)


def merge(t: torch.Tensor) -> torch.Tensor:
    """(b, heads, n, d) -> (b, n, heads * d)."""
    b, n_heads, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, n_heads * d)


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

    def self_context(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Return the layer's self-attention context (heads merged), before its output projection.

        ``mask``: (b, 1, 1, n) boolean, True on the keys that are real tokens.
        """
        att = self.attention.self
        q, k, v = (heads(proj(x), self.n_heads) for proj in (att.query, att.key, att.value))
        return merge(F.scaled_dot_product_attention(q, k, v, mask))

    def finish(self, context: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Run the rest of the layer after its attention context (heads merged): output projection, FFN."""
        x = self.attention.output.LayerNorm(self.attention.output.dense(context) + x)
        return self.output.LayerNorm(self.output.dense(F.gelu(self.intermediate.dense(x))) + x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.finish(self.self_context(x, mask), x)


class PlainBert(nn.Module):
    """BERT's encoder (no pooler) in plain torch, with transformers' parameter names.

    Built empty (on the meta device, so nothing is initialised); :meth:`load` assigns the weights.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        c = SimpleNamespace(**{k: config[k] for k in CONFIG_KEYS})
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

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Return the embeddings' output, the first layer's input: (batch, tokens, hidden)."""
        e = self.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        x = e.word_embeddings(input_ids) + e.token_type_embeddings(types) + e.position_embeddings(positions)
        return e.LayerNorm(x)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> SimpleNamespace:
        """Return ``last_hidden_state``: (batch, tokens, hidden), as transformers' BertModel does."""
        x = self.embed(input_ids, token_type_ids)
        mask = attention_mask.bool()[:, None, None, :]  # keys that are real tokens
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return SimpleNamespace(last_hidden_state=x)


def as_plain(model: nn.Module) -> PlainBert | None:
    """Return a PlainBert (CPU, float32) holding a loaded transformers BERT's weights, or None if they do not fit.

    Only the names and shapes are checked here; whether it computes the same is for the caller to check.
    """
    config = {k: getattr(model.config, k, None) for k in CONFIG_KEYS}
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    try:
        plain = PlainBert(config)
        wanted = set(plain.state_dict())
        return plain.load({k: v for k, v in state.items() if k in wanted})
    except (RuntimeError, TypeError) as exc:  # names or shapes differ: not the architecture PlainBert computes
        log.info("PlainBert does not compute this model (%s)", exc)
        return None


def plain_bert(model: nn.Module) -> PlainBert | None:
    """Return a PlainBert of a loaded transformers model's weights, or None where it is no plain BERT encoder."""
    config: Any = getattr(model, "config", None)
    if config is None or not supports(config.to_dict()):
        return None
    return as_plain(model)


class LastHidden(nn.Module):
    """A BERT-style model as a graph of (input_ids, attention_mask, token_type_ids) -> its last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state
