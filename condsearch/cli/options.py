"""Every option that more than one command takes, and the helpers that read option defaults from configs.

Each default is read from its one home (a frozen config dataclass or a named constant), never
copied: ``config_option`` makes an option of a config field, ``config_from`` builds the config
back from the parsed options, and ``given`` names the flags set on the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from condsearch.defaults import DEFAULT_INDEX_DIR, INDEX_DIR_ENV
from condsearch.errors import CondsearchError, first_line
from condsearch.model.artifacts import DEFAULT_MODE, MODE_AUTO, MODES, PROFILE_AUTO, ROUTER_AUTO
from condsearch.model.csr import DEFAULT_VARIANT, ROUTER_VARIANTS
from condsearch.model.encoders import BACKEND_CHOICES, CpuConfig, EncoderSpec
from condsearch.scale import RayConfig, check_address

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C")

# ----------------------------------------------------------------- defaults from configs


def config_option(config: object, field: str, *decls: str, **attrs: Any) -> Callable[[F], F]:
    """Return ``click.option(*decls)`` for ``config.<field>``: passed as ``field``, defaulting to its value.

    ``config`` is an instance, so a default set in ``__post_init__`` (one that depends on another
    field) shows in --help too. A tuple of strings is given and shown as a comma-separated list.
    """
    value = getattr(config, field)
    if isinstance(value, tuple):
        value = ",".join(str(v) for v in value)
    return click.option(*decls, field, default=value, show_default=value is not None, **attrs)


def config_from(cls: type[C], params: Mapping[str, Any], **overrides: Any) -> C:
    """Build cls from the command's parameters named like its fields, then the overrides."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in params.items() if k in names and k not in overrides}, **overrides)


def given(ctx: click.Context, *names: str) -> list[str]:
    """Return the flags of the named parameters set on the command line (not left at their defaults)."""
    flags = {p.name: p.opts[-1] for p in ctx.command.params if isinstance(p, click.Option)}
    return [flags.get(n, n) for n in names if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]


def _apply(options: list[Callable[[Any], Any]], command: F) -> F:
    """Return command with the options added, the first listed shown first in --help."""
    for option in reversed(options):
        command = option(command)
    return command


# ----------------------------------------------------------------- finite numbers


class FiniteFloat(click.types.FloatParamType):
    """A float option that refuses nan and ±inf (``float()`` takes 'nan', 'inf' and '1e400' as numbers)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that refuses nan and ±inf first: every comparison with nan is false, so a range alone
    lets it through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(FINITE_FLOAT.convert(value, param, ctx), param, ctx)


#: the type of every float option without bounds (one with bounds: FiniteFloatRange)
FINITE_FLOAT = FiniteFloat()


# ----------------------------------------------------------------- where, on what


index_dir_option = click.option(
    "--index-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=INDEX_DIR_ENV,
    default=str(DEFAULT_INDEX_DIR),
    show_default=True,
    help=f"Folder holding the indexes (env {INDEX_DIR_ENV}).",
)
device_option = click.option(
    "--device",
    default=None,
    help="Torch device, e.g. cpu or cuda:0; several (cuda:0,cuda:1) split each batch (default: CUDA when present).",
)
trust_option = click.option(
    "--trust-remote-code", is_flag=True, help="Allow the model folder's own Python code to run (off by default)."
)


def threads_option(command: F) -> F:
    """Add --threads (torch's and onnxruntime's intra-op threads)."""
    from condsearch.model.encoders import CpuConfig

    return click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=CpuConfig.threads,
        help="Threads for the encoder's matrix products on the CPU [default: every core].",
    )(command)


def backend_option(help: str) -> Callable[[F], F]:
    """Return ``--backend auto|torch`` (what runs the encoder; one default: ``CpuConfig.backend``) with help."""
    return click.option(
        "--backend", type=click.Choice(BACKEND_CHOICES), default=CpuConfig.backend, show_default=True, help=help
    )


def quantize_option(command: F) -> F:
    """Add --quantize for building (index): the setting the encoder runs at, recorded in the manifest."""
    from condsearch.model.encoders import QUANTIZE_AUTO, QUANTIZE_CHOICES, CpuConfig

    return click.option(
        "--quantize",
        type=click.Choice((*QUANTIZE_CHOICES, QUANTIZE_AUTO)),
        default=CpuConfig.quantize,
        show_default=True,
        help=(
            "int8: the encoder (with --mode csr, the router's two passes) runs as onnxruntime's dynamic int8 "
            "export on the CPU (adapter merged); auto: int8 where this CPU kind measured it faster than its "
            "float path, else none (CONDSEARCH_CPU_KIND); "
            "recorded in the manifest, and a query with another setting is refused."
        ),
    )(command)


def quantize_check_option(command: F) -> F:
    """Add --quantize for reading (query, serve): each index runs as built; another value is refused."""
    from condsearch.model.encoders import QUANTIZE_CHOICES

    return click.option(
        "--quantize",
        type=click.Choice(QUANTIZE_CHOICES),
        default=None,
        help="Refuse indexes built with another setting (none: float32) [default: as each index was built].",
    )(command)


# ----------------------------------------------------------------- how texts become vectors


def _newlines(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else value.replace("\\n", "\n")


def _unless_default(ctx: click.Context, param: click.Parameter, value: object) -> object:
    # A value left at its default is passed as None, so that a preset or an adapter may set it.
    return None if ctx.get_parameter_source(str(param.name)) is ParameterSource.DEFAULT else value


def encoder_options(command: F) -> F:
    """Add --pooling, --prompt-template, --unconditional-template, --dtype, --bidirectional-layers and --preset."""
    from condsearch.model.encoders import DTYPES, POOLINGS, PRESETS, DecoderAttention

    options = [
        click.option(
            "--pooling",
            type=click.Choice(POOLINGS),
            default=EncoderSpec.pooling,
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
            default=EncoderSpec.dtype,
            show_default=True,
            help="Weights dtype; auto is bfloat16 for LLM embedders on CUDA where supported, and for BERT-style "
            "encoders on a CPU whose bfloat16 products measured faster (AMX; an AMD's AVX-512 BF16; see "
            "CONDSEARCH_CPU_KIND), else float32.",
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
    return _apply(options, command)


mode_option = click.option(
    "--mode",
    type=click.Choice((MODE_AUTO, *MODES)),
    default=DEFAULT_MODE,
    show_default=True,
    help=(
        "csr: router tri-encoder over cached sentence states (a new condition costs a fraction of a full "
        "pass); case: CASE bi-encoder (one forward pass per pair; sharper on captions). auto: csr for the "
        "default model, whose router ships, unless a case-only flag (--profile, --adapter, --head, --pooling, "
        "--prompt-template, --unconditional-template, --dtype, --bidirectional-layers, --preset) is given; "
        "case for other models."
    ),
)


def router_options(command: F) -> F:
    """Add --router, --router-layer and --router-variant (index --mode csr)."""
    options = [
        click.option(
            "--router",
            default=ROUTER_AUTO,
            show_default=True,
            help="--mode csr: trained router folder, 'default' (shipped for the default model) or 'none' (untrained).",
        ),
        click.option(
            "--router-layer",
            default=None,
            type=int,
            help="--mode csr: first routed backbone layer [default: the router's, else the last].",
        ),
        click.option(
            "--router-variant",
            type=click.Choice(ROUTER_VARIANTS),
            default=None,
            help=(
                "--mode csr: paper is eq. 1 of the router paper (layer t's own W_Q, (1 + w), no gain); extended is "
                "ours (a trainable query copy, a learned gain, a condition-generated projection); context is ours "
                "(sentence tokens attend to the condition's tokens in the top k layers; an untrained one takes k "
                f"as --router-layer -k) [default: the trained router's, else {DEFAULT_VARIANT}]."
            ),
        ),
    ]
    return _apply(options, command)


def profile_options(command: F) -> F:
    """Add --profile, --adapter and --head (index): what turns the model's outputs into index vectors."""
    options = [
        click.option(
            "--profile",
            default=None,
            help=(
                "Adapter + head together, shipped for the default model: 'full' (its full fine-tune on C-STS as "
                "a rank-64 delta, no head, 384-d; what 'default' names), 'lora' (a LoRA adapter + 256-d head, the "
                "earlier default), 'frozen' (a head on the frozen encoder); or 'none', 'auto' ('default' for "
                f"the default model, else none) or a folder from train (adapter and/or head) [default: {PROFILE_AUTO}]."
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
                "With --adapter: a head folder or 'none' [default: none]. Alone: the older spelling of --profile "
                "(a profile's name, or a folder holding a head and/or an adapter)."
            ),
        ),
    ]
    return _apply(options, command)


#: query's --profile (with --head, its older spelling): a check against what the index was built with
query_profile_option = click.option(
    "--profile",
    "--head",
    "profile",
    default=None,
    help="Must match the profile the index was built with [default: the index's]; --head is its older spelling.",
)

# ----------------------------------------------------------------- scale-out: Ray, Milvus

STORE_FORMS = "milvus-lite:PATH.db (embedded Milvus Lite) or milvus://HOST:PORT (a server; env MILVUS_TOKEN)"


def _address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else check_address(value)
    except CondsearchError as exc:
        raise click.BadParameter(first_line(exc).partition(": ")[2], ctx, param) from exc


def _store_spec(ctx: click.Context, param: click.Parameter, value: str | None, *, create: bool = True) -> str | None:
    """Check a --store value, and a Milvus Lite path on disk: writers may create a database, readers may not."""
    if value is None:
        return None
    from condsearch.scale import check_lite_path, parse_store

    try:
        target = parse_store(value)
        if target is not None and target.lite:
            check_lite_path(value, target.uri, create=create)
    except CondsearchError as exc:
        raise click.BadParameter(first_line(exc).partition(": ")[2], ctx, param) from exc
    return value


def _read_store_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return _store_spec(ctx, param, value, create=False)


def ray_options(command: F) -> F:
    """Add --ray [ADDRESS], --ray-actors and --ray-work-dir (index)."""
    options = [
        click.option(
            "--ray",
            "ray_address",
            is_flag=False,
            flag_value=RayConfig.address,
            default=None,
            metavar="[ADDRESS]",
            callback=_address,
            help=(
                "Encode on Ray Data (condsearch[ray]): alone, a local Ray instance; 'auto', ray://HOST:PORT or "
                "HOST:PORT joins a cluster. Every row is encoded (no reuse of unchanged rows)."
            ),
        ),
        click.option(
            "--ray-actors",
            type=click.IntRange(min=1),
            default=RayConfig.actors,
            help="--ray: encoder replicas [default: one per GPU (num_gpus=1 each), else one per CPU].",
        ),
        click.option(
            "--ray-work-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=RayConfig.work_dir,
            help="--ray: folder for row and vector shards, one path every node sees [default: INDEX_DIR/.ray-work].",
        ),
    ]
    return _apply(options, command)


#: --store on index: a Milvus to publish to (created if need be)
publish_store_option = click.option(
    "--store",
    "store_spec",
    default=None,
    callback=_store_spec,
    help=f"Also publish each index to Milvus: {STORE_FORMS}; the FAISS copy in --index-dir stays.",
)


def read_store_option(what: str) -> Callable[[F], F]:
    """Return --store on a reading command (query, serve): a Milvus that must exist, in place of --index-dir."""
    return click.option(
        "--store",
        "store_spec",
        default=None,
        callback=_read_store_spec,
        help=f"{what} indexes in Milvus instead of --index-dir: {STORE_FORMS}.",
    )


#: export's --to: a Milvus to push to (created if need be)
export_target_option = click.option(
    "--to", "spec", required=True, callback=_store_spec, help=f"Where to: {STORE_FORMS}."
)


def refuse_index_dir_beside_store(store_spec: str | None, what: str) -> None:
    """Refuse an --index-dir given on the command line together with --store (an environment default is no conflict)."""
    source = click.get_current_context().get_parameter_source("index_dir")
    if store_spec is not None and source is ParameterSource.COMMANDLINE:
        raise click.UsageError(f"--index-dir and --store name two places to {what}; give one")
