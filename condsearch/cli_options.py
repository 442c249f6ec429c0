"""Options shared by several commands of the CLI (kept apart so cli.py stays a thin list of commands)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
from click.core import ParameterSource

index_dir_option = click.option(
    "--index-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="CONDSEARCH_INDEX_DIR",
    default="indexes",
    show_default=True,
    help="Folder holding the indexes (env CONDSEARCH_INDEX_DIR).",
)
device_option = click.option(
    "--device",
    default=None,
    help="Torch device, e.g. cpu or cuda:0; several (cuda:0,cuda:1) split each batch (default: CUDA when present).",
)
trust_option = click.option(
    "--trust-remote-code", is_flag=True, help="Allow the model folder's own Python code to run (off by default)."
)


def _newlines(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else value.replace("\\n", "\n")


def _unless_default(ctx: click.Context, param: click.Parameter, value: object) -> object:
    # A value left at its default is passed as None, so that a preset or an adapter may set it.
    return None if ctx.get_parameter_source(str(param.name)) is ParameterSource.DEFAULT else value


def encoder_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add --pooling, --prompt-template, --unconditional-template, --dtype, --bidirectional-layers and --preset."""
    from condsearch.encoders.family import DTYPES, POOLINGS, PRESETS, DecoderAttention

    options = [
        click.option(
            "--pooling",
            type=click.Choice(POOLINGS),
            default="auto",
            show_default=True,
            help=(
                "Last token (Qwen3-Embedding, gte-Qwen2), mean of all tokens (e5/SFR-Mistral) or the "
                "condition's tokens (condition-mean, BERT-style); auto picks by model family. prompt-last: "
                "the prompt's own last token, no end-of-text token appended (BeLLM)."
            ),
        ),
        click.option(
            "--prompt-template",
            default=None,
            callback=_newlines,
            help=(
                "Conditional input, with {condition} and {sentence}; \\n is a newline "
                "[default: the CASE prompt; for NV-Embed, the instruction]."
            ),
        ),
        click.option(
            "--unconditional-template",
            default=None,
            callback=_newlines,
            help="Unconditional input, with {condition} [default: the CASE prompt; for NV-Embed, the instruction].",
        ),
        click.option(
            "--dtype",
            type=click.Choice(DTYPES),
            default="auto",
            show_default=True,
            help="Weights dtype; auto is bfloat16 for LLM embedders on CUDA where supported, else float32.",
        ),
        click.option(
            "--bidirectional-layers",
            type=click.IntRange(min=0),
            default=DecoderAttention.bidirectional_layers,
            show_default=True,
            callback=_unless_default,
            help=(
                "Decoder embedders: the top N layers attend in both directions, the rest stay causal (BeLLM: 1). "
                "Left unset, --preset or the LoRA adapter (--profile, --adapter) decides; a config with "
                "is_causal: false makes every layer bidirectional."
            ),
        ),
        click.option(
            "--preset",
            type=click.Choice(tuple(PRESETS)),
            default=None,
            help=(
                "Paper settings for the flags left unset. bellm: BeLLM's C-STS prompt, the last layer "
                "bidirectional, mean pooling (as BeLLM's released training ran)."
            ),
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


mode_option = click.option(
    "--mode",
    type=click.Choice(["case", "csr"]),
    default="case",
    show_default=True,
    help="case: CASE bi-encoder (one forward pass per pair); csr: router tri-encoder over cached sentence states.",
)


router_variant_option = click.option(
    "--router-variant",
    type=click.Choice(["paper", "extended", "context"]),  # condsearch.csr.context.ROUTER_VARIANTS (no torch here)
    default=None,
    help=(
        "--mode csr: paper is eq. 1 of the router paper (layer t's own W_Q, (1 + w), no gain); extended is ours "
        "(a trainable query copy, a learned gain, a condition-generated projection); context is ours (sentence "
        "tokens attend to the condition's tokens in the top k layers; an untrained one takes k as --router-layer "
        "-k) [default: the trained router's, else paper]."
    ),
)


def router_options(f):  # noqa: ANN001, ANN201 - a click decorator
    f = router_variant_option(f)
    f = click.option(
        "--router-layer",
        default=None,
        type=int,
        help="--mode csr: first routed backbone layer [default: the router's, else the last].",
    )(f)
    return click.option(
        "--router",
        default="auto",
        show_default=True,
        help="--mode csr: trained router folder, 'default' (shipped for the default model) or 'none' (untrained).",
    )(f)


def quantize_option(command: Callable[..., None]) -> Callable[..., None]:
    """Add --quantize for building (index): the setting the encoder runs at, recorded in the manifest."""
    from condsearch.encoders.cpu import QUANTIZE_CHOICES, CpuConfig

    return click.option(
        "--quantize",
        type=click.Choice(QUANTIZE_CHOICES),
        default=CpuConfig.quantize,
        show_default=True,
        help=(
            "int8: the encoder runs as onnxruntime's dynamic int8 export on the CPU (adapter merged); "
            "recorded in the manifest, and a query with another setting is refused."
        ),
    )(command)


def quantize_check_option(command: Callable[..., None]) -> Callable[..., None]:
    """Add --quantize for reading (query, serve): each index runs as built; another value is refused."""
    from condsearch.encoders.cpu import QUANTIZE_CHOICES

    return click.option(
        "--quantize",
        type=click.Choice(QUANTIZE_CHOICES),
        default=None,
        help="Refuse indexes built with another setting (none: float32) [default: as each index was built].",
    )(command)


def threads_option(command: Callable[..., None]) -> Callable[..., None]:
    """Add --threads (torch's and onnxruntime's intra-op threads)."""
    from condsearch.encoders.cpu import CpuConfig

    return click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=CpuConfig.threads,
        help="Threads for the encoder's matrix products on the CPU [default: every core].",
    )(command)


def profile_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add --profile, --adapter and --head (index): what turns the model's outputs into index vectors."""
    options = [
        click.option(
            "--profile",
            default=None,
            help=(
                "Adapter + head together, shipped for the default model: 'full' (its full fine-tune on C-STS as "
                "a rank-64 delta, no head, 384-d; what 'default' names), 'lora' (a LoRA adapter + 256-d head, the "
                "earlier default), 'frozen' (a head on the frozen encoder); or 'none', 'auto' ('default' for "
                "the default model, else none) or a folder from train (adapter and/or head) [default: auto]."
            ),
        ),
        click.option(
            "--adapter",
            type=click.Path(exists=True, file_okay=False, path_type=Path),
            default=None,
            help="LoRA adapter folder (PEFT's format, from train lora), merged into the model.",
        ),
        click.option(
            "--head",
            default=None,
            help=(
                "Head folder or 'none' [default: none with --adapter]. As before --profile, 'auto', 'default', "
                "'full', 'lora', 'frozen' and a folder holding an adapter name a profile."
            ),
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command
