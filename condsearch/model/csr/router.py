"""The condition-specified router on a BERT-family backbone, split at router layer t.

Per sentence (condition-independent, cacheable): layers 0..t-1, then in layer t the input
``x`` (for the residual), the keys ``k`` and the attention context ``c`` (before the output
projection). Per condition: a :class:`ConditionCode`, the query ``q_c`` of each routed layer
(that layer's query projection of the condition's final [CLS] state) and the condition's
mean-pooled final state. Per pair, in every routed layer j >= t:
``w = mean_heads softmax(q_c k_j^T / sqrt(d_head))`` over the sentence's real tokens,
``c_j * (1 + w)``, then the rest of layer j; the last layer's output is mean-pooled.

:class:`RouterConfig` names the variant. Its defaults are eq. 1 of the router paper (seed 002):
one routed layer (t = T-1), the query from layer t's own W_Q, no gain, nothing added. Every
other setting is this project's own extension and is labelled so wherever results appear:
a decoupled (trainable copy of the) query projection, a learned gain g in (1 + g·w), and a
condition-generated low-rank update of the pooled vector (Hyper-CL-inspired).

Everything here calls the backbone's own submodules; no layer code is copied.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
from torch import nn

import condsearch.model.csr.variants as variants  # not from the package, whose __init__ imports this module
from condsearch.model.csr.variants import RoutedVariant as Variant
from condsearch.model.encoders.pooling import mean_pool


@dataclass(frozen=True)
class RouterConfig:
    """How the router conditions. The defaults are the paper's eq. 1; see :data:`EXTENDED`."""

    layer: int = -1  # first routed layer t; negative counts from the top (-1: the last layer only)
    decoupled_query: bool = False  # ours: q_c from a trainable copy of each routed layer's W_Q
    learn_gain: bool = False  # ours: (1 + g·w) with a learned g per routed layer (log-parametrised)
    hyper_rank: int = 0  # ours: rank of the condition-generated update of the pooled vector (0: none)
    hyper_bottleneck: int = 64  # ours: width of the condition code that generates that update

    @property
    def variant(self) -> Variant:
        """Return 'paper' when nothing beyond eq. 1 is switched on, else 'extended'."""
        ours = self.decoupled_query or self.learn_gain or self.hyper_rank > 0
        return variants.EXTENDED if ours else variants.PAPER

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "variant": self.variant}

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> RouterConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})  # type: ignore[arg-type]

    def describe(self) -> str:
        """Return a short label for tables, e.g. 'paper (eq. 1), t=-1'."""
        if self.variant == variants.PAPER:
            return f"paper (eq. 1), layer {self.layer}"
        parts = []
        if self.decoupled_query:
            parts.append("decoupled query")
        if self.learn_gain:
            parts.append("learned gain")
        if self.hyper_rank:
            parts.append(f"condition projection r={self.hyper_rank}")
        return f"extended (ours: {', '.join(parts)}), layer {self.layer}"


#: The paper's router (seed 002, eq. 1), with the SPEC's training split (layers below t frozen).
PAPER = RouterConfig()
#: The project's extended router, chosen on dev (benchmarks/README.md): every extension on.
EXTENDED = RouterConfig(decoupled_query=True, learn_gain=True, hyper_rank=16)
PRESETS: dict[Variant, RouterConfig] = {variants.PAPER: PAPER, variants.EXTENDED: EXTENDED}


@dataclass
class SentenceStates:
    """Cached layer-t states of a padded batch of sentences.

    x, k, c: (batch, length, hidden); mask: (batch, length) bool, True on real tokens. The
    context router (:mod:`condsearch.model.csr.context`) caches x alone and leaves k and c None.
    """

    x: torch.Tensor
    k: torch.Tensor | None
    c: torch.Tensor | None
    mask: torch.Tensor


@dataclass
class ConditionCode:
    """What a condition contributes: q (batch, n_routed, hidden) and e (batch, hidden).

    A batch of 1 applies one condition to every sentence of a batch.
    """

    q: torch.Tensor
    e: torch.Tensor

    def flat(self) -> torch.Tensor:
        """Return (batch, (n_routed + 1) * hidden), the form kept in the query cache."""
        return torch.cat([self.q.flatten(1), self.e], dim=1)

    @classmethod
    def unflat(cls, flat: torch.Tensor, n_routed: int) -> ConditionCode:
        hidden = flat.shape[1] // (n_routed + 1)
        return cls(flat[:, : n_routed * hidden].view(-1, n_routed, hidden), flat[:, n_routed * hidden :])

    def select(self, rows: torch.Tensor) -> ConditionCode:
        return ConditionCode(self.q[rows], self.e[rows])

    @classmethod
    def cat(cls, codes: list[ConditionCode]) -> ConditionCode:
        """Stack several codes into one batch (each sentence of a batch under its own condition)."""
        return cls(torch.cat([c.q for c in codes]), torch.cat([c.e for c in codes]))


def _layers(model: nn.Module) -> Any:
    """Return the backbone's layer list (typed Any: transformers builds its submodules dynamically)."""
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} is not a BERT-family encoder (no encoder.layer list)")
    return layers


def _attention_mask(model: Any, hidden: torch.Tensor, mask: torch.Tensor) -> Any:
    """Build the mask the backbone's own layers expect with its own helper (a tensor, a block mask or None)."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:  # transformers < 4.56
        return model.get_extended_attention_mask(mask, mask.shape)  # type: ignore[operator]
    return create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=mask.long())


class ConditionProjection(nn.Module):
    """Ours (after Hyper-CL's condition-generated projections, seed 002's comparison):
    ``v + U(c) V(c)^T v`` with U, V (hidden × rank) generated from the condition's pooled
    state through a small code. U starts at zero, so an untrained projection is the identity.
    """

    def __init__(self, hidden: int, rank: int, bottleneck: int) -> None:
        super().__init__()
        self.hidden, self.rank = hidden, rank
        self.code = nn.Linear(hidden, bottleneck)
        self.u = nn.Linear(bottleneck, hidden * rank)
        self.v = nn.Linear(bottleneck, hidden * rank)
        nn.init.zeros_(self.u.weight)
        nn.init.zeros_(self.u.bias)

    def forward(self, vectors: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """vectors (b, hidden); condition (b | 1, hidden) -> (b, hidden)."""
        z = torch.tanh(self.code(condition))
        u = self.u(z).view(-1, self.hidden, self.rank)
        v = self.v(z).view(-1, self.hidden, self.rank)
        low = torch.einsum("bdr,bd->br", v.expand(vectors.shape[0], -1, -1), vectors)
        return vectors + torch.einsum("bdr,br->bd", u.expand(vectors.shape[0], -1, -1), low)


class Router(nn.Module):
    """A backbone split at router layer t, routing every layer from t up.

    Trainable (``trainable="top"``, the default): the rest of layer t after its self-attention,
    the layers above, and whatever the config adds (query copies, gains, the condition
    projection). Frozen: the embeddings, the layers below t and layer t's query/key/value, so
    that cached sentence states stay valid. ``trainable="all"`` trains the whole backbone as the
    paper does (its sentence states then depend on the trained weights).
    """

    def __init__(
        self, model: nn.Module, config: RouterConfig = PAPER, w_scale: float = 1.0, trainable: str = "top"
    ) -> None:
        super().__init__()
        self.model = model
        self.trainable = trainable
        layers = _layers(model)
        n = len(layers)
        layer = config.layer
        self.layer = layer if layer >= 0 else n + layer
        if not 0 <= self.layer < n:
            raise ValueError(f"router layer {layer} outside 0..{n - 1}")
        self.config = replace(config, layer=self.layer)  # the layer counted from the bottom
        self.routed = list(range(self.layer, n))
        attn = layers[self.layer].attention.self
        self.n_heads = int(attn.num_attention_heads)
        self.head_dim = int(attn.attention_head_size)
        hidden = int(getattr(model, "config").hidden_size)  # noqa: B009 - a transformers config, untyped here
        self.router_queries = (
            nn.ModuleList(copy.deepcopy(layers[j].attention.self.query) for j in self.routed)
            if config.decoupled_query
            else None
        )
        self.log_gain = nn.Parameter(torch.zeros(len(self.routed))) if config.learn_gain else None
        self.projection = (
            ConditionProjection(hidden, config.hyper_rank, config.hyper_bottleneck) if config.hyper_rank else None
        )
        # A fixed multiplier for tests and ablations: 0 turns routing off (the plain forward pass).
        self.w_scale = w_scale

    #: what the sentence cache holds per token (see :class:`condsearch.model.csr.cache.StateCache`)
    state_names: tuple[str, ...] = ("x", "k", "c")

    def code_from_flat(self, flat: torch.Tensor) -> ConditionCode:
        """Rebuild a condition's code from the form the query cache keeps (:meth:`ConditionCode.flat`)."""
        return ConditionCode.unflat(flat, len(self.routed))

    # -- which parameters train -------------------------------------------------------------
    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Return the parameters that training updates, by their state-dict names.

        With ``trainable="all"`` the backbone's own parameters (``backbone.`` and the backbone's
        names, its unused pooler left out) take the place of the routed layers'.
        """
        layers = _layers(self.model)
        t = layers[self.layer]
        modules: dict[str, nn.Module] = {
            f"layer{self.layer}.attention_output": t.attention.output,
            f"layer{self.layer}.intermediate": t.intermediate,
            f"layer{self.layer}.output": t.output,
        }
        for j in self.routed[1:]:
            modules[f"layer{j}"] = layers[j]
        if self.trainable == "all":
            modules = {}
        if self.router_queries is not None:
            modules["router_query"] = self.router_queries
        if self.projection is not None:
            modules["projection"] = self.projection
        params = {f"{prefix}.{name}": p for prefix, m in modules.items() for name, p in m.named_parameters()}
        if self.trainable == "all":
            backbone = self.model.named_parameters()
            params.update({f"backbone.{n}": p for n, p in backbone if not n.startswith("pooler.")})
        if self.log_gain is not None:
            params["router_log_gain"] = self.log_gain
        return params

    def freeze_backbone(self) -> None:
        """Freeze everything but :meth:`trainable_parameters`."""
        for p in self.parameters():
            p.requires_grad_(False)
        for p in self.trainable_parameters().values():
            p.requires_grad_(True)

    def gains(self) -> list[float]:
        """Return the gain g of each routed layer (1.0 throughout for the paper's router)."""
        if self.log_gain is None:
            return [1.0] * len(self.routed)
        return [float(g) for g in self.log_gain.detach().exp().tolist()]

    # -- per sentence -------------------------------------------------------------------------
    def sentence_states(self, inputs: dict[str, torch.Tensor]) -> SentenceStates:
        """Run the condition-independent part for a tokenized batch of sentences."""
        model: Any = self.model
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
    def condition_codes(self, inputs: dict[str, torch.Tensor]) -> ConditionCode:
        """Return the code of each condition in a tokenized batch."""
        out = self.model(**inputs).last_hidden_state
        cls = out[:, 0]
        layers = _layers(self.model)
        if self.router_queries is not None:
            qs = [proj(cls) for proj in self.router_queries]
        else:
            qs = [layers[j].attention.self.query(cls) for j in self.routed]
        return ConditionCode(torch.stack(qs, dim=1), mean_pool(out, inputs["attention_mask"]))

    # -- per pair ------------------------------------------------------------------------------
    def _weights(self, q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Routing weights (b, L) of queries q (b|1, hidden) over keys (b, L, hidden)."""
        b, length, _ = keys.shape
        q = q.view(-1, 1, self.n_heads, self.head_dim).transpose(1, 2)  # (b|1, H, 1, dh)
        k = keys.view(b, length, self.n_heads, self.head_dim).transpose(1, 2)  # (b, H, L, dh)
        scores = (q @ k.transpose(-1, -2)).squeeze(2) / self.head_dim**0.5  # (b, H, L)
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return scores.softmax(dim=-1).mean(dim=1)  # sums to 1 over real tokens

    def route(self, states: SentenceStates, code: ConditionCode | None) -> torch.Tensor:
        """Finish each sentence's forward pass under its condition; mean-pool: (b, hidden).

        code: one per sentence, or a batch of 1 for one condition; None is the plain forward
        pass (what a candidate without a condition gets).
        """
        layers = _layers(self.model)
        ext = _attention_mask(self.model, states.x, states.mask)
        hidden = states.x
        routing = code is not None and self.w_scale != 0.0
        gains = self.log_gain.exp() if self.log_gain is not None else None
        for i, j in enumerate(self.routed):
            layer = layers[j]
            keys: torch.Tensor | None
            if i == 0:
                assert states.k is not None and states.c is not None  # the paper/extended router caches them
                keys, context = states.k, states.c
            else:
                attn = layer.attention.self
                context = _layer_out(attn(hidden, attention_mask=ext))
                keys = attn.key(hidden) if routing else None
            if routing:
                assert code is not None and keys is not None
                w = self._weights(code.q[:, i], keys, states.mask)
                gain = self.w_scale * (gains[i] if gains is not None else 1.0)
                context = context * (1.0 + gain * w).unsqueeze(-1)
            out = layer.attention.output(context, hidden)
            hidden = layer.output(layer.intermediate(out), out)
        pooled = mean_pool(hidden, states.mask)
        if code is not None and self.projection is not None:
            pooled = self.projection(pooled, code.e)
        return pooled


def _layer_out(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Layers return a tensor in recent transformers and a tuple in older ones."""
    return out[0] if isinstance(out, tuple) else out
