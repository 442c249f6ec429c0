"""Ours, not the router paper's: the condition as attention context in the top k layers only.

The router paper's released code (REFERENCE.md §3.2) prepends the condition's hidden states as
extra keys and values in every layer, so nothing about a sentence can be cached. Here only the
top k of the backbone's T layers do so:

- Per sentence, once (cacheable, condition-independent): the embeddings and layers 0..T-k-1 on
  the sentence alone. The cache holds their output ``x`` (the input of layer T-k), nothing else.
- Per condition, once (cacheable): the condition encoded alone; the inputs of layers T-k..T-1
  for its tokens, a :class:`ContextCode`.
- Per (sentence, condition): in each layer j >= T-k the sentence tokens attend to the condition's
  keys and values at that depth (layer j's own key/value projections of the condition's layer-j
  input) as well as to their own; the layer runs as the backbone's own module, given those
  prefix keys and values through transformers' key/value cache, with a mask over both. The
  sentence tokens of the last layer are mean-pooled, as the paper/extended router pools.

Eq. 1's multiplicative ``(1 + w)`` reweighting is not offered inside this variant: it scales the
attention context before the layer's output projection, which the layer's own call does not
expose, so it would need a second copy of the layer's attention.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from torch import nn

from condsearch.model.csr.router import SentenceStates, _attention_mask, _layer_out, _layers
from condsearch.model.csr.variants import CONTEXT
from condsearch.model.encoders.pooling import mean_pool

#: which backbone parameters train: every one, or only the top k layers (the sentence cache then holds)
TrainScope = Literal["all", "top"]
TRAIN_SCOPES: tuple[TrainScope, ...] = ("all", "top")


@dataclass(frozen=True)
class ContextConfig:
    """The context router's one setting: k, how many top layers see the condition (ours)."""

    k: int = 2

    @property
    def variant(self) -> str:
        return CONTEXT

    @property
    def layer(self) -> int:
        """Return the first layer that sees the condition, counted from the top (-k)."""
        return -self.k

    def to_dict(self) -> dict[str, object]:
        return {"k": self.k, "variant": CONTEXT}

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> ContextConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})  # type: ignore[arg-type]

    def describe(self) -> str:
        """Return a short label for tables."""
        return f"context (ours: condition keys/values in the top {self.k} layer(s))"


#: the default context router: k chosen on dev from the accuracy-cost curve (issue 22)
CONTEXT_DEFAULT = ContextConfig()


@dataclass
class ContextCode:
    """What conditions contribute: h (batch, k, length, hidden), the inputs of the top k layers
    for each condition token, and mask (batch, length) bool, True on real tokens.

    A batch of 1 applies one condition to every sentence of a batch.
    """

    h: torch.Tensor
    mask: torch.Tensor

    def flat(self) -> torch.Tensor:
        """Return (batch, k * length * hidden), the form kept in the query cache (unpadded codes only)."""
        return self.h.flatten(1)

    @classmethod
    def unflat(cls, flat: torch.Tensor, k: int, hidden: int) -> ContextCode:
        length = flat.shape[1] // (k * hidden)
        h = flat.view(flat.shape[0], k, length, hidden)
        return cls(h, torch.ones(flat.shape[0], length, dtype=torch.bool, device=flat.device))

    def select(self, rows: torch.Tensor) -> ContextCode:
        return ContextCode(self.h[rows], self.mask[rows])

    @classmethod
    def cat(cls, codes: list[ContextCode]) -> ContextCode:
        """Stack several codes into one batch, padding the shorter conditions (masked out)."""
        length = max(c.h.shape[2] for c in codes)
        h = torch.cat([nn.functional.pad(c.h, (0, 0, 0, length - c.h.shape[2])) for c in codes])
        mask = torch.cat([nn.functional.pad(c.mask, (0, length - c.mask.shape[1])) for c in codes])
        return cls(h, mask)


def _cache_kwarg(layer: nn.Module) -> str:
    """Return the name under which a BERT layer takes a key/value cache object (transformers >= 5)."""
    params = inspect.signature(type(layer).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise ValueError("the context router needs transformers >= 5 (a BERT layer that takes a key/value cache)")


class ContextRouter(nn.Module):
    """A backbone whose top k layers let sentence tokens attend to the condition's tokens (ours).

    ``trainable`` says which parameters :meth:`trainable_parameters` names: ``all`` (the whole
    backbone but its unused pooler) or ``top`` (layers T-k..T-1, below which cached sentence
    states stay valid).
    """

    state_names: tuple[str, ...] = ("x",)

    def __init__(
        self, model: nn.Module, config: ContextConfig = CONTEXT_DEFAULT, trainable: TrainScope = "all"
    ) -> None:
        super().__init__()
        self.model = model
        layers = _layers(model)
        n = len(layers)
        if not 1 <= config.k <= n:
            raise ValueError(f"context router k={config.k} outside 1..{n}")
        self.config = config
        self.layer = n - config.k
        self.routed = list(range(self.layer, n))
        self.trainable = trainable
        attn = layers[self.layer].attention.self
        self.head_dim = int(attn.attention_head_size)
        self.hidden = int(getattr(model, "config").hidden_size)  # noqa: B009 - a transformers config, untyped here
        self._cache_kwarg = _cache_kwarg(layers[self.layer])

    # -- which parameters train -------------------------------------------------------------
    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Return the parameters training updates, by the backbone's own names (as a delta adapter keys them)."""
        top = tuple(f"encoder.layer.{j}." for j in self.routed)
        return {
            name: p
            for name, p in self.model.named_parameters()
            if not name.startswith("pooler.") and (self.trainable == "all" or name.startswith(top))
        }

    def freeze_backbone(self) -> None:
        """Freeze everything but :meth:`trainable_parameters`."""
        for p in self.parameters():
            p.requires_grad_(False)
        for p in self.trainable_parameters().values():
            p.requires_grad_(True)

    def frozen_below(self) -> list[nn.Module]:
        """Return the modules below the routed layers that do not train (none when all train)."""
        if self.trainable == "all":
            return []
        model: Any = self.model
        return [model.embeddings, *list(_layers(model))[: self.layer]]

    def gains(self) -> list[float]:
        """Return the routing gains: none, as this variant has no multiplicative routing."""
        return []

    def code_from_flat(self, flat: torch.Tensor) -> ContextCode:
        """Rebuild a condition's code from the form the query cache keeps (:meth:`ContextCode.flat`)."""
        return ContextCode.unflat(flat, len(self.routed), self.hidden)

    # -- per sentence and per condition --------------------------------------------------------
    def _embed(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        model: Any = self.model
        mask = inputs["attention_mask"].bool()
        hidden = model.embeddings(input_ids=inputs["input_ids"], token_type_ids=inputs.get("token_type_ids"))
        return hidden, mask, _attention_mask(model, hidden, mask)

    def sentence_states(self, inputs: dict[str, torch.Tensor]) -> SentenceStates:
        """Run layers 0..T-k-1 on a tokenized batch of sentences alone: the condition-independent part."""
        hidden, mask, ext = self._embed(inputs)
        layers = _layers(self.model)
        for j in range(self.layer):
            hidden = _layer_out(layers[j](hidden, attention_mask=ext))
        return SentenceStates(hidden, None, None, mask)

    def condition_codes(self, inputs: dict[str, torch.Tensor]) -> ContextCode:
        """Encode each condition of a tokenized batch alone; keep the inputs of the top k layers."""
        hidden, mask, ext = self._embed(inputs)
        layers = _layers(self.model)
        kept = []
        for j in range(len(layers)):
            if j >= self.layer:
                kept.append(hidden)
            if j + 1 < len(layers):  # the last layer's output is no layer's input
                hidden = _layer_out(layers[j](hidden, attention_mask=ext))
        return ContextCode(torch.stack(kept, dim=1), mask)

    # -- per pair ------------------------------------------------------------------------------
    def _heads(self, projection: nn.Module, states: torch.Tensor) -> torch.Tensor:
        """Project (b, L, hidden) and split into heads as the layer's self-attention does: (b, H, L, dh)."""
        b, length, _ = states.shape
        return projection(states).view(b, length, -1, self.head_dim).transpose(1, 2)

    def route(self, states: SentenceStates, code: ContextCode | None) -> torch.Tensor:
        """Finish each sentence's forward pass with its condition as context; mean-pool: (b, hidden).

        code: one per sentence, or a batch of 1 for one condition; None is the plain forward
        pass (the sentence without a condition).
        """
        from transformers.cache_utils import DynamicCache

        model: Any = self.model
        layers = _layers(model)
        hidden = states.x
        b = hidden.shape[0]
        extra: dict[str, Any] = {}
        mask = states.mask
        if code is not None:
            cache = DynamicCache()
            for i, j in enumerate(self.routed):
                attn = layers[j].attention.self
                h = code.h[:, i]
                keys, values = self._heads(attn.key, h), self._heads(attn.value, h)
                cache.update(keys.expand(b, -1, -1, -1), values.expand(b, -1, -1, -1), j)
            extra[self._cache_kwarg] = cache
            mask = torch.cat([code.mask.expand(b, -1), states.mask], dim=1)
        ext = _attention_mask(model, hidden, mask)  # queries: the sentence; keys: condition then sentence
        for j in self.routed:
            hidden = _layer_out(layers[j](hidden, attention_mask=ext, **extra))
        return mean_pool(hidden, states.mask)
