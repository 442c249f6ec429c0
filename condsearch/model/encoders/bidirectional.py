"""Bidirectional top layers for decoder embedders (BeLLM's backward dependency).

BeLLM removes the causal mask from the last layer(s) of a decoder LLM, so that every token
of the input sees every other token there, while the layers below stay causal. Nothing of
the layers is rewritten here: transformers' own decoder layers run as loaded, and two hooks
change only what the top layers are given:

- a pre-hook on the base model keeps the 2-D padding mask of each call;
- a pre-hook on each of the top N decoder layers replaces the causal mask the model built
  with transformers' bidirectional one (``masking_utils.create_bidirectional_mask``, or its
  sliding-window form for a sliding layer), built from that padding mask for the model's
  attention implementation, and the layer's attention module gets ``is_causal = False``
  (what SDPA without a mask and flash attention read).

Padded positions stay masked as keys in both directions, so a text gives the same states
alone or in a left-padded batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from condsearch.errors import ModelError


def decoder_layers(model: nn.Module) -> list[Any]:
    """Return the decoder layers of a transformers model, bottom first.

    Raises ModelError for an architecture without a ``layers`` list of self-attention layers.
    """
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(hasattr(layer, "self_attn") for layer in layers):
        raise ModelError(f"{type(model).__name__}: no decoder layers with self-attention to make bidirectional")
    n = getattr(getattr(model, "config", None), "num_hidden_layers", len(layers))
    return list(layers)[:n]


def config_is_bidirectional(config: Any) -> bool:
    """Return whether a model config (object or config.json dict) says it attends both ways (``is_causal: false``)."""
    value = config.get("is_causal") if isinstance(config, dict) else getattr(config, "is_causal", None)
    return value is False


def make_bidirectional(model: nn.Module, n_layers: int) -> Callable[[], None]:
    """Make the top ``n_layers`` decoder layers of model attend in both directions, in place.

    Returns a function that undoes it (removes the hooks, restores the causal flags).
    Raises ModelError when n_layers is out of range.
    """
    layers = decoder_layers(model)
    if not 0 <= n_layers <= len(layers):
        raise ModelError(f"--bidirectional-layers {n_layers}: the model has {len(layers)} layers")
    if n_layers == 0:
        return lambda: None
    try:
        from transformers.masking_utils import create_bidirectional_mask, create_bidirectional_sliding_window_mask
    except ImportError as exc:
        import transformers

        raise ModelError(
            f"bidirectional layers need transformers' masking_utils.create_bidirectional_mask "
            f"(transformers {transformers.__version__} lacks it); upgrade transformers"
        ) from exc
    base = getattr(model, "base_model", model)
    config: Any = base.config
    # Per call: the padding mask, and each kind of bidirectional mask once it is built.
    state: dict[str, Any] = {}

    def keep_padding(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        mask = kwargs["attention_mask"] if "attention_mask" in kwargs else (args[1] if len(args) > 1 else None)
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.ndim != 2):
            raise ModelError("bidirectional layers need a 2-D padding mask (or none), not a prepared attention mask")
        state.clear()
        state["padding"] = mask

    def forget(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        state.clear()

    def swap_mask(layer: nn.Module) -> Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]:
        sliding = getattr(layer.self_attn, "sliding_window", None) is not None

        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if "padding" not in state:
                raise ModelError("a bidirectional layer ran outside its model's forward pass")
            hidden = args[0] if args else kwargs["hidden_states"]
            key = "sliding" if sliding else "full"
            if key not in state:
                build = create_bidirectional_sliding_window_mask if sliding else create_bidirectional_mask
                state[key] = build(config=config, inputs_embeds=hidden, attention_mask=state["padding"])
            kwargs["attention_mask"] = state[key]
            return args, kwargs

        return hook

    top = layers[len(layers) - n_layers :]
    handles = [
        base.register_forward_pre_hook(keep_padding, with_kwargs=True),
        base.register_forward_hook(forget, with_kwargs=True),
    ]
    flags = []
    for layer in top:
        handles.append(layer.register_forward_pre_hook(swap_mask(layer), with_kwargs=True))
        flags.append((layer.self_attn, getattr(layer.self_attn, "is_causal", True)))
        layer.self_attn.is_causal = False

    def undo() -> None:
        for handle in handles:
            handle.remove()
        for attention, flag in flags:
            attention.is_causal = flag

    return undo
