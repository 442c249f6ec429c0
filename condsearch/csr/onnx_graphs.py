"""The router's two halves in plain torch, the tracing source of their ONNX export (:mod:`condsearch.csr.onnx`).

Built from :class:`~condsearch.encoders.onnx_trace.PlainBert` (transformers' BERT traces to a graph
that computes something else on padded batches; see :mod:`condsearch.encoders.onnx_trace`), with the
router's own weights:

- :class:`LowerPass`: the embeddings and the layers below the router's first routed layer, on a
  tokenized batch of sentences: the states the state cache keeps (x; for the paper/extended router
  also layer t's keys k and attention context c).
- :class:`ContextRoute` and :class:`PaperRoute`: the routed layers and the mean pooling, from cached
  states (padded, with their mask) and a condition code (one per sentence, or a batch of 1 for all).

Masks cross the graph as int64 (1 on real tokens). Nothing here runs at inference time in torch:
torch inference is :mod:`condsearch.csr.router` and :mod:`condsearch.csr.context`, and every export
is checked against them before use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from condsearch.encoders.onnx_trace import PlainBert


def _heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(b, n, hidden) -> (b, heads, n, hidden / heads)."""
    b, n, h = t.shape
    return t.view(b, n, n_heads, h // n_heads).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    """(b, heads, n, d) -> (b, n, heads * d)."""
    b, heads, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, heads * d)


def _finish(layer: Any, context: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Run the rest of a BERT layer after its attention context (heads merged): output projection, FFN."""
    x = layer.attention.output.LayerNorm(layer.attention.output.dense(context) + x)
    return layer.output.LayerNorm(layer.output.dense(F.gelu(layer.intermediate.dense(x))) + x)


def _self_context(layer: Any, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Return a layer's self-attention context (heads merged), before its output projection."""
    att = layer.attention.self
    q, k, v = (_heads(proj(x), layer.n_heads) for proj in (att.query, att.key, att.value))
    return _merge(F.scaled_dot_product_attention(q, k, v, keep))


def _mean_pool(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    keep = mask.unsqueeze(-1).to(x.dtype)
    return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)


class LowerPass(nn.Module):
    """Embeddings and layers 0..t-1 of a sentence batch: x (b, L, hidden); with ``keys``, also layer t's k and c."""

    def __init__(self, plain: PlainBert, layer: int, *, keys: bool) -> None:
        super().__init__()
        self.plain, self.layer, self.keys = plain, layer, keys

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        e: Any = self.plain.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = e.word_embeddings(input_ids) + e.token_type_embeddings(token_type_ids) + e.position_embeddings(positions)
        x = e.LayerNorm(x)
        keep = attention_mask.bool()[:, None, None, :]
        layers: Any = self.plain.encoder.layer
        for j in range(self.layer):
            x = layers[j](x, keep)
        if not self.keys:
            return x
        t = layers[self.layer]
        return x, t.attention.self.key(x), _self_context(t, x, keep)


class ContextRoute(nn.Module):
    """The context router's top k layers with the condition's keys and values first, then mean pooling.

    forward(x (b, L, hidden), mask (b, L), h (b|1, k, Lc, hidden), condition_mask (b|1, Lc)) -> (b, hidden).
    """

    def __init__(self, plain: PlainBert, routed: Sequence[int]) -> None:
        super().__init__()
        layers: Any = plain.encoder.layer
        self.layers = nn.ModuleList(layers[j] for j in routed)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, h: torch.Tensor, condition_mask: torch.Tensor
    ) -> torch.Tensor:
        b = x.shape[0]
        h = h.expand(b, -1, -1, -1)
        keep = torch.cat([condition_mask.expand(b, -1), mask], dim=1).bool()[:, None, None, :]
        layer: Any
        for i, layer in enumerate(self.layers):
            att, n = layer.attention.self, layer.n_heads
            hc = h[:, i]
            k = torch.cat([_heads(att.key(hc), n), _heads(att.key(x), n)], dim=2)
            v = torch.cat([_heads(att.value(hc), n), _heads(att.value(x), n)], dim=2)
            context = _merge(F.scaled_dot_product_attention(_heads(att.query(x), n), k, v, keep))
            x = _finish(layer, context, x)
        return _mean_pool(x, mask)


class PaperRoute(nn.Module):
    """The paper/extended router's routed layers (eq. 1's ``c * (1 + g w)``), mean pooling and projection.

    forward(x, k, c (b, L, hidden), mask (b, L), q (b|1, n_routed, hidden), e (b|1, hidden)) -> (b, hidden).
    ``gains``: each routed layer's multiplier of w (the learned gain times the router's w scale).
    """

    def __init__(
        self, plain: PlainBert, routed: Sequence[int], gains: Sequence[float], projection: nn.Module | None
    ) -> None:
        super().__init__()
        layers: Any = plain.encoder.layer
        self.layers = nn.ModuleList(layers[j] for j in routed)
        self.gains = [float(g) for g in gains]
        self.projection = projection
        c: Any = plain.config
        self.scale = float(c.hidden_size // c.num_attention_heads) ** -0.5

    def forward(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        c: torch.Tensor,
        mask: torch.Tensor,
        q: torch.Tensor,
        e: torch.Tensor,
    ) -> torch.Tensor:
        real = mask.bool()
        keep = real[:, None, None, :]
        keys, context = k, c
        layer: Any
        for i, layer in enumerate(self.layers):
            n = layer.n_heads
            if i > 0:
                context = _self_context(layer, x, keep)
                keys = layer.attention.self.key(x)
            qh = q[:, i].unsqueeze(1)  # (b|1, 1, hidden)
            scores = (_heads(qh, n) @ _heads(keys, n).transpose(-1, -2)).squeeze(2) * self.scale  # (b, H, L)
            w = scores.masked_fill(~real[:, None, :], float("-inf")).softmax(dim=-1).mean(dim=1)
            context = context * (1.0 + self.gains[i] * w).unsqueeze(-1)
            x = _finish(layer, context, x)
        pooled = _mean_pool(x, mask)
        return self.projection(pooled, e) if self.projection is not None else pooled
