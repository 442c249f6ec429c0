"""Which kind of model a folder holds, how it pools, and the CASE prompts it is given."""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from condsearch.errors import ModelError

Family = Literal["decoder", "nvembed", "bert"]
Pooling = Literal["auto", "last", "mean", "condition-mean", "prompt-last"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
DTYPES: tuple[str, ...] = get_args(DType)

# CASE reference inputs (SPEC §2.1): the condition is the "Query", the sentence sits in the
# "Condition" slot. Note the space before each colon and the newline before "Condition".
CASE_PROMPT = (
    "Instruct : Retrieve semantically similar texts to a given Query, under the given Condition "
    "Query : {condition}\nCondition : {sentence}"
)
CASE_UNCONDITIONAL = "Instruct : Retrieve semantically similar texts Query : {condition}"
# NV-Embed takes an instruction and a text; the text is always the condition.
NV_INSTRUCTION = "Retrieve semantically similar texts to a given {condition}, under the given: {sentence}"
NV_UNCONDITIONAL = "Retrieve semantically similar texts"
# BeLLM's C-STS prompt (its section 5.1): the model is asked for one word that summarises the
# sentence in the condition's context, and the state that would predict that word is the
# embedding. The unconditional form, the same prompt with the sentence left out, is our own:
# BeLLM subtracts nothing.
BELLM_PROMPT = 'Given the context {condition}, summarize the sentence {sentence} in one word:"'
BELLM_UNCONDITIONAL = 'Given the context {condition}, summarize the sentence in one word:"'

_NVEMBED_TYPES = {"nvembed"}
_BERT_TYPES = {
    "albert",
    "bert",
    "camembert",
    "deberta",
    "deberta-v2",
    "distilbert",
    "electra",
    "ernie",
    "mpnet",
    "modernbert",
    "nomic_bert",
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
}
_DECODER_TYPES = {
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "llama",
    "mistral",
    "mixtral",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
}
# Families whose published embedders average over all tokens rather than take the last one
# (e5-mistral / SFR-Embedding-Mistral as used by CASE).
_MEAN_POOLED_TYPES = {"mistral"}


def detect_family(config: Mapping[str, object]) -> Family:
    """Return the model family named by a config.json's ``model_type`` and ``architectures``."""
    model_type = str(config.get("model_type") or "").lower()
    raw = config.get("architectures") or []
    archs = [str(a) for a in raw] if isinstance(raw, list) else []
    if model_type in _NVEMBED_TYPES or any(a.startswith("NVEmbed") for a in archs):
        return "nvembed"
    if model_type in _BERT_TYPES:
        return "bert"
    if model_type in _DECODER_TYPES or config.get("is_decoder") is True:
        return "decoder"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return "decoder"
    # Unknown encoders keep the behaviour every model had before families existed.
    return "bert"


def default_pooling(family: Family, config: Mapping[str, object]) -> Pooling:
    """Return the pooling the reference code uses for this family and model type."""
    if family == "bert":
        return "condition-mean"
    if family == "nvembed":
        return "auto"  # the model pools with its own latent attention
    model_type = str(config.get("model_type") or "").lower()
    return "mean" if model_type in _MEAN_POOLED_TYPES else "last"


def _fields(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ModelError(f"prompt template {template!r}: {exc}") from exc


@dataclass(frozen=True)
class PromptTemplates:
    """The text given for f(c; I(s)) (``conditional``) and for f(c; I(∅)) (``unconditional``).

    Templates are ``str.format`` strings over ``{condition}`` and ``{sentence}``; literal
    braces are written ``{{`` and ``}}``.
    """

    conditional: str = CASE_PROMPT
    unconditional: str = CASE_UNCONDITIONAL

    def __post_init__(self) -> None:
        cond, uncond = _fields(self.conditional), _fields(self.unconditional)
        for name, fields in (("conditional", cond), ("unconditional", uncond)):
            unknown = fields - {"condition", "sentence"}
            if unknown:
                raise ModelError(f"{name} prompt template uses unknown field(s) {sorted(unknown)}")
        if "sentence" not in cond:
            raise ModelError("the conditional prompt template needs a {sentence} placeholder")
        if "sentence" in uncond:
            raise ModelError("the unconditional prompt template cannot use {sentence}")

    def render(self, condition: str, sentence: str | None) -> str:
        """Return the prompt for (condition, sentence); a sentence of None gives the unconditional one."""
        if sentence is None:
            return self.unconditional.format(condition=condition)
        return self.conditional.format(condition=condition, sentence=sentence)

    def digest(self) -> str:
        """Return a short hash of both templates."""
        text = f"{self.conditional}\x00{self.unconditional}"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True)
class DecoderAttention:
    """Which layers of a decoder embedder attend in both directions.

    The top ``bidirectional_layers`` layers see the whole input (BeLLM turns the last one,
    N = 1); the layers below stay causal. A model whose config says ``is_causal: false``
    (gte-Qwen2) attends both ways in every layer whatever this says.
    """

    bidirectional_layers: int = 0

    def __post_init__(self) -> None:
        if self.bidirectional_layers < 0:
            raise ModelError("--bidirectional-layers must be 0 or more")


@dataclass(frozen=True)
class Preset:
    """A named set of encoder settings from a paper: pooling, prompts and bidirectional layers."""

    pooling: Pooling
    templates: PromptTemplates
    attention: DecoderAttention


#: ``--preset`` choices. bellm: BeLLM's C-STS prompt, the last layer bidirectional, and the mean
#: of the final states, as BeLLM's released training ran (``--pooling_strategy avg``). The paper's
#: text pools the state at the prompt's last token (``prompt-last``), but with only the top
#: layer bidirectional that state is exactly the causal model's: the last token already attends
#: to every token, and the layers below are unchanged. Only pooling over the other tokens lets
#: the backward dependency reach the vector.
PRESETS: dict[str, Preset] = {
    "bellm": Preset("mean", PromptTemplates(BELLM_PROMPT, BELLM_UNCONDITIONAL), DecoderAttention(1)),
}


def default_templates(family: Family) -> PromptTemplates:
    """Return the CASE reference prompts for a family (NV-Embed's are instructions)."""
    if family == "nvembed":
        return PromptTemplates(NV_INSTRUCTION, NV_UNCONDITIONAL)
    return PromptTemplates()


def templates_with(family: Family, conditional: str | None, unconditional: str | None) -> PromptTemplates:
    """Return the family's default templates with either one replaced."""
    base = default_templates(family)
    return PromptTemplates(conditional or base.conditional, unconditional or base.unconditional)
