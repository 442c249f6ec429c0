"""The condition-specified router on a BERT-family backbone, split at router layer t.

Per sentence (condition-independent, cacheable): layers 0..t-1, then in layer t the input
``x`` (for the residual), the keys ``k`` and the attention context ``c`` (before the output
projection). Per condition: ``q_c``, a query projection of the condition's final [CLS] state.
Per pair: ``w = mean_heads softmax(q_c k^T / sqrt(d_head))`` over the sentence's tokens,
``c * (1 + w)``, then the rest of layer t and the layers above, mean-pooled.

Everything here calls the backbone's own submodules; no layer code is copied.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class SentenceStates:
    """Cached layer-t states of a padded batch of sentences.

    x, k, c: (batch, length, hidden); mask: (batch, length) bool, True on real tokens.
    """

    x: torch.Tensor
    k: torch.Tensor
    c: torch.Tensor
    mask: torch.Tensor


def _layers(model: nn.Module) -> nn.ModuleList:
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} is not a BERT-family encoder (no encoder.layer list)")
    return layers


def _attention_mask(model: nn.Module, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """Build the mask the backbone's own layers expect, with the backbone's own helper."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:  # transformers < 4.56
        return model.get_extended_attention_mask(mask, mask.shape)  # type: ignore[operator]
    return create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=mask.long())


class Router(nn.Module):
    """A backbone split at ``layer`` with a trainable router query projection.

    Trainable: the router query (initialised from layer t's query projection), the rest of
    layer t after its self-attention, and the layers above. Frozen: the embeddings, layers
    below t and layer t's query/key/value, so that cached sentence states stay valid.
    """

    def __init__(self, model: nn.Module, layer: int | None = None, w_scale: float = 1.0) -> None:
        super().__init__()
        self.model = model
        layers = _layers(model)
        n = len(layers)
        self.layer = n - 1 if layer is None else (layer if layer >= 0 else n + layer)
        if not 0 <= self.layer < n:
            raise ValueError(f"router layer {layer} outside 0..{n - 1}")
        attn = layers[self.layer].attention.self
        self.n_heads = int(attn.num_attention_heads)
        self.head_dim = int(attn.attention_head_size)
        self.router_query = copy.deepcopy(attn.query)
        # A learnable gain on the routing weights, log-parametrised; gain 1 is (1 + w) exactly.
        # The weights sum to 1 over the tokens, so without it routing moves each token by ~1/L.
        self.log_gain = nn.Parameter(torch.zeros(()))
        # A fixed multiplier for tests and ablations: 0 turns routing off (the plain forward pass).
        self.w_scale = w_scale

    # -- which parameters train -------------------------------------------------------------
    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Return the parameters that training updates, by their state-dict names."""
        layers = _layers(self.model)
        t = layers[self.layer]
        modules = {"router_query": self.router_query, f"layer{self.layer}.attention_output": t.attention.output}
        modules[f"layer{self.layer}.intermediate"] = t.intermediate
        modules[f"layer{self.layer}.output"] = t.output
        for j in range(self.layer + 1, len(layers)):
            modules[f"layer{j}"] = layers[j]
        params = {f"{prefix}.{name}": p for prefix, m in modules.items() for name, p in m.named_parameters()}
        params["router_log_gain"] = self.log_gain
        return params

    def freeze_backbone(self) -> None:
        """Freeze everything but :meth:`trainable_parameters`."""
        for p in self.parameters():
            p.requires_grad_(False)
        for p in self.trainable_parameters().values():
            p.requires_grad_(True)

    # -- per sentence -------------------------------------------------------------------------
    def sentence_states(self, inputs: dict[str, torch.Tensor]) -> SentenceStates:
        """Run the condition-independent part for a tokenized batch of sentences."""
        model = self.model
        layers = _layers(model)
        mask = inputs["attention_mask"].bool()
        hidden = model.embeddings(input_ids=inputs["input_ids"], token_type_ids=inputs.get("token_type_ids"))
        ext = _attention_mask(model, hidden, mask)
        for j in range(self.layer):
            hidden = _layer_out(layers[j](hidden, attention_mask=ext))
        attn = layers[self.layer].attention.self
        context = _layer_out(attn(hidden, attention_mask=ext))
        keys = attn.key(hidden)
        return SentenceStates(hidden, keys, context, mask)

    # -- per condition ------------------------------------------------------------------------
    def condition_queries(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return q_c for a tokenized batch of conditions: (batch, hidden)."""
        out = self.model(**inputs).last_hidden_state[:, 0]
        return self.router_query(out)

    # -- per pair ------------------------------------------------------------------------------
    def route(self, states: SentenceStates, queries: torch.Tensor) -> torch.Tensor:
        """Finish the forward pass of each sentence under its condition query; mean-pool.

        states: a batch of b sentences; queries: (b, hidden) or (1, hidden) for one condition.
        Returns (b, hidden).
        """
        b, length, _ = states.k.shape
        q = queries.view(-1, 1, self.n_heads, self.head_dim).transpose(1, 2)  # (b|1, H, 1, dh)
        k = states.k.view(b, length, self.n_heads, self.head_dim).transpose(1, 2)  # (b, H, L, dh)
        scores = (q @ k.transpose(-1, -2)).squeeze(2) / self.head_dim**0.5  # (b, H, L)
        scores = scores.masked_fill(~states.mask[:, None, :], float("-inf"))
        w = scores.softmax(dim=-1).mean(dim=1)  # (b, L), sums to 1 over real tokens
        gain = self.w_scale * self.log_gain.exp()
        routed = states.c * (1.0 + gain * w).unsqueeze(-1)
        layers = _layers(self.model)
        t = layers[self.layer]
        hidden = t.attention.output(routed, states.x)
        hidden = t.output(t.intermediate(hidden), hidden)
        ext = _attention_mask(self.model, hidden, states.mask)
        for j in range(self.layer + 1, len(layers)):
            hidden = _layer_out(layers[j](hidden, attention_mask=ext))
        m = states.mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


def _layer_out(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Layers return a tensor in recent transformers and a tuple in older ones."""
    return out[0] if isinstance(out, tuple) else out
