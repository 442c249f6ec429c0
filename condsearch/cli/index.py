"""`condsearch index`: encode a corpus under each condition into stored indexes."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from condsearch.base import DEFAULT_MODEL, IndexConfig, check_index_options
from condsearch.cli.common import CONTEXT, confirm_case_variant, fail, open_store, yes_option
from condsearch.cli.options import (
    backend_option,
    device_option,
    encoder_options,
    index_dir_option,
    mode_option,
    profile_options,
    publish_store_option,
    quantize_option,
    ray_options,
    router_options,
    threads_option,
    trust_option,
)
from condsearch.corpus import FORMATS, CorpusConfig
from condsearch.errors import CaseVariant, CondsearchError
from condsearch.model.artifacts import MODE_AUTO, MODE_CSR, ROUTER_AUTO, resolve_mode
from condsearch.model.encoders import ENCODE_BATCH_SIZE

if TYPE_CHECKING:
    from condsearch.corpus import CorpusFile
    from condsearch.ingest import BuildReport
    from condsearch.model.encoders import EncoderSpec
    from condsearch.store import IndexStore

#: index's options that are EncoderSpec fields of the same name (--adapter and the runtime's are converted)
_SPEC_OPTIONS = (
    "model", "mode", "profile", "head", "pooling", "prompt_template", "unconditional_template", "max_length", "dtype",
    "bidirectional_layers", "preset", "quantize", "router", "router_layer", "router_variant",
)  # fmt: skip


def _check_index_options(factory: str, search_params: str) -> None:
    try:
        check_index_options(factory, search_params)
    except ValueError as exc:  # a library error, one line (exit 1)
        raise CondsearchError(str(exc)) from exc


#: index's flags that apply to one mode only (or with --ray only); every other flag applies to both
_DECODER_FLAGS = ("--bidirectional-layers", "--preset")
_ENCODER_FLAGS = ("--pooling", "--prompt-template", "--unconditional-template", "--dtype")
_CSR_FLAGS = ("--router", "--router-layer", "--router-variant")
_RAY_FLAGS = ("--ray-actors", "--ray-work-dir")


def _check_flags(mode: str, flags: set[str], *, ray: bool) -> None:
    """Refuse, before any work, a flag set (off its default) that does not apply to --mode, or that needs --ray."""
    if mode == MODE_CSR:
        if flags.intersection(_DECODER_FLAGS):
            raise click.UsageError("--bidirectional-layers and --preset apply to --mode case (decoder embedders)")
        if flags.intersection(_ENCODER_FLAGS):
            # the router tri-encoder pools and runs its own way: these would be silently dropped
            raise click.UsageError(
                "--pooling, --prompt-template, --unconditional-template and --dtype apply to --mode case"
            )
    elif flags.intersection(_CSR_FLAGS):
        raise click.UsageError("--router, --router-layer and --router-variant apply to --mode csr")
    if not ray and (needs_ray := [f for f in _RAY_FLAGS if f in flags]):
        raise click.UsageError(f"{' and '.join(needs_ray)} appl{'ies' if len(needs_ray) == 1 else 'y'} with --ray")


@click.command("index", context_settings=CONTEXT)
@click.argument("corpus", type=click.Path(path_type=Path))
@click.option(
    "-c",
    "--condition",
    "conditions",
    multiple=True,
    help=(
        "Condition to index under; repeat for several. At least one: with --mode csr, `query` builds further "
        "conditions on demand from the corpus's indexes."
    ),
)
@click.option(
    "--format",
    "corpus_format",
    type=click.Choice(FORMATS),
    default=CorpusConfig.format,
    help="Corpus file format [default: by extension: .parquet, .csv, .jsonl/.ndjson; else parquet].",
)
@click.option("--text-column", default=CorpusConfig.text_column, show_default=True, help="Column holding the texts.")
@click.option(
    "--id-column",
    default=CorpusConfig.id_column,
    help="Column holding unique ids [default: 'id' if present, else row number].",
)
@click.option(
    "--keep-columns",
    default=None,
    help=(
        "The corpus's other columns to keep beside each row, in their types, comma-separated (e.g. 'lang,year'; "
        "'' keeps none), for `query --where` filters and each result's metadata [default: every one]."
    ),
)
@click.option("--name", "corpus_name", default=None, help="Corpus name in the store [default: the file's stem].")
@click.option("--model", default=None, help=f"Model id or local folder [default: {DEFAULT_MODEL}].")
@profile_options
@click.option(
    "--index-factory",
    default=IndexConfig.factory,
    show_default=True,
    help=(
        "FAISS factory string, e.g. 'HNSW32' or 'IVF1024,PQ32' (trained on a sample), or 'auto': Flat, HNSW or "
        "IVF-PQ by corpus size and --max-index-memory."
    ),
)
@click.option(
    "--search-params",
    default=IndexConfig.search_params,
    help=(
        "FAISS search parameters recorded in the manifest and used by query and serve, e.g. 'nprobe=32' "
        "(IVF) or 'efSearch=128' (HNSW) [default: FAISS's; auto's own]."
    ),
)
@click.option(
    "--max-index-memory",
    default=IndexConfig.max_index_memory,
    show_default=True,
    help="Memory budget of --index-factory auto, e.g. 512M or 16G.",
)
@click.option("--full", is_flag=True, help="Encode every row again instead of reusing the vectors of unchanged rows.")
@click.option(
    "--batch-size",
    default=ENCODE_BATCH_SIZE,
    show_default=True,
    type=click.IntRange(min=1),
    help="Pairs per forward pass.",
)
@click.option(
    "--max-length", default=None, type=click.IntRange(min=8), help="Token limit per input [default: the model's]."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per index written.")
@mode_option
@router_options
@encoder_options
@quantize_option
@backend_option(
    "What runs the encoder. auto: onnxruntime on the CPU with every core wherever a one-shot query of "
    "the index would run it (BERT-style, condition-mean pooling; its checked float32 export, written first "
    "if missing) and, with --mode csr, the router's two passes from their checked float32 export; else "
    "torch (on a CPU whose bfloat16 products measured faster, AMX or an AMD's AVX-512 BF16, torch in bfloat16: "
    "CASE in --dtype auto's "
    "bfloat16, and the context router's two passes under autocast); torch: always transformers (float32 for "
    "the router). "
    "The index is the same either way.",
)
@threads_option
@index_dir_option
@device_option
@trust_option
@ray_options
@publish_store_option
@yes_option
def index_cmd(corpus: Path, conditions: tuple[str, ...], **params: Any) -> None:
    """Encode CORPUS (parquet, CSV or JSON lines) under each condition and store one index per condition.

    Re-indexing the same corpus under the same condition replaces its index atomically, and
    encodes only rows that are new or whose text, encoder, adapter, head or router changed
    (rows are matched by id); the old index answers until the new one is in. The corpus is
    read and encoded in chunks, and an interrupted run resumes after its last finished chunk.
    With --mode csr, sentence states are cached once (env CONDSEARCH_CACHE_DIR), so each
    further condition costs only the router's per-pair remainder. On the CPU a BERT-style model
    runs on onnxruntime where a one-shot query would (--backend). --ray encodes on Ray Data
    (actors on workers and GPUs); --store also publishes the indexes to Milvus. A condition that differs
    from one the corpus is indexed under only in case (a cased model's) is built only once confirmed (--yes).
    """
    from condsearch.corpus import scan_corpus
    from condsearch.store import check_new_condition

    if not conditions:
        raise click.UsageError(_NO_CONDITION)
    try:
        store = open_store(params["index_dir"])
        spec, build = _settings(corpus, params, store, conditions)
        for c in conditions:
            check_new_condition(c)
        _check_index_options(build["factory"], build["search_params"])
        keep = keep_columns_option(params["keep_columns"])
        data = scan_corpus(
            corpus, params["text_column"], params["id_column"], format=params["corpus_format"], keep=keep
        )
        if data.n_skipped:
            click.echo(f"condsearch: skipped {data.n_skipped} null or blank text(s)", err=True)
        yes = params["yes"] or _confirmed(store, build["corpus_name"], conditions)
        start = time.perf_counter()
        reports, backend = _encode(data, conditions, spec, store, params, build, case_variants=yes)
        elapsed = time.perf_counter() - start
        if params["store_spec"] is not None:
            _publish(store, reports, params["store_spec"])
    except CondsearchError as exc:
        raise fail(exc) from exc
    _print_reports(store, reports, len(data), elapsed, backend, as_json=params["as_json"])


def _confirmed(store: IndexStore, corpus_name: str, conditions: tuple[str, ...]) -> bool:
    """Ask before each build under a case-only variant of an indexed condition (issue 59); return whether any was
    confirmed (False where none is a variant). Refuses, in one line, where stdin is not a terminal."""
    from condsearch.store import refuse_case_variants

    listing, asked = store.manifests(), False
    for condition in conditions:
        try:
            refuse_case_variants(listing, corpus_name, [condition])
        except CaseVariant as exc:
            confirm_case_variant(exc, condition)
            asked = True
    return asked


def keep_columns_option(value: str | None) -> tuple[str, ...] | None:
    """Return --keep-columns as column names: None (not given) keeps every column, '' none."""
    if value is None:
        return CorpusConfig.keep_columns
    names = tuple(name.strip() for name in value.split(","))
    if names == ("",):
        return ()
    if any(not name for name in names):
        raise click.UsageError(f"--keep-columns {value!r}: a column name is empty")
    return names


#: index without -c: the states alone would leave no index that a later query could find the corpus by
_NO_CONDITION = (
    "give at least one --condition: with --mode csr, `condsearch query -c C` then builds any other condition "
    "on demand from the sentence states that indexing cached, which needs one index of the corpus to find it by"
)


def _settings(
    corpus: Path, params: Mapping[str, Any], store: IndexStore, conditions: tuple[str, ...]
) -> tuple[EncoderSpec, dict[str, Any]]:
    """Return the encoder spec and the index's build settings from index's options, refusing flags that do not apply.

    --mode auto keeps the mode of the corpus's indexes under these conditions already in the store.
    """
    from condsearch.model.encoders import EncoderSpec, Runtime
    from condsearch.store import kept_mode

    corpus_name = params["corpus_name"] or corpus.stem

    off_default = {
        "--pooling": params["pooling"] != EncoderSpec.pooling,
        "--prompt-template": bool(params["prompt_template"]),
        "--unconditional-template": bool(params["unconditional_template"]),
        "--dtype": params["dtype"] != EncoderSpec.dtype,
        "--bidirectional-layers": params["bidirectional_layers"] is not None,
        "--preset": params["preset"] is not None,
        "--quantize": params["quantize"] != EncoderSpec.quantize,
        "--router": params["router"] != ROUTER_AUTO,
        "--router-layer": params["router_layer"] is not None,
        "--router-variant": params["router_variant"] is not None,
        "--ray-actors": params["ray_actors"] is not None,
        "--ray-work-dir": params["ray_work_dir"] is not None,
    }
    flags = {flag for flag, off in off_default.items() if off}
    named = any(params[name] is not None for name in ("profile", "adapter", "head"))
    params = {
        **params,
        "mode": resolve_mode(
            params["mode"],
            params["model"],
            case_settings=named or bool(flags.intersection(_ENCODER_FLAGS + _DECODER_FLAGS)),
            router=bool(flags.intersection(_CSR_FLAGS)),
            kept=kept_mode(store.manifests(), corpus_name, conditions) if params["mode"] == MODE_AUTO else None,
        ),
    }
    _check_flags(params["mode"], flags, ray=params["ray_address"] is not None)
    from condsearch.model import resolve_quantize  # auto: int8 where this CPU kind measured it faster

    params = {**params, "quantize": resolve_quantize(params["quantize"], params["mode"], params["device"])}
    # --profile, --adapter and --head under --mode csr are refused by the profile's resolution (a usage error);
    # the case-only flags are refused above, so under csr they hold their defaults
    adapter = params["adapter"]
    spec = EncoderSpec(
        **{name: params[name] for name in _SPEC_OPTIONS},
        adapter=str(adapter) if adapter is not None else None,
        runtime=Runtime(
            device=params["device"], threads=params["threads"], trust_remote_code=params["trust_remote_code"]
        ),
    )
    build = {
        "corpus_name": corpus_name,
        "factory": params["index_factory"],
        "search_params": params["search_params"],
        "max_index_memory": params["max_index_memory"],
        "batch_size": params["batch_size"],
    }
    return spec, build


def _encode(
    data: CorpusFile,
    conditions: tuple[str, ...],
    spec: EncoderSpec,
    store: IndexStore,
    params: Mapping[str, Any],
    build: dict[str, Any],
    *,
    case_variants: bool,
) -> tuple[list[BuildReport], str]:
    """Encode and index data under each condition, here or (--ray) on Ray Data; return the reports and the backend.

    ``case_variants``: build under a condition that differs from an indexed one only in case (confirmed).
    """
    if params["ray_address"] is None:
        from condsearch.ingest import index_conditions
        from condsearch.model import backend_of, load_model_for

        reindex = None
        if not params["full"] and len(conditions) == 1:  # its own model may re-index it without torch
            from condsearch.store import kept_index

            kept = kept_index(store.manifests(), build["corpus_name"], conditions[0])
            reindex = (kept, conditions[0]) if kept is not None else None
        vec = load_model_for("bulk", spec, backend=params["backend"], reindex=reindex)
        reports = index_conditions(
            data, conditions, vec, store, full=params["full"], progress=True, case_variants=case_variants, **build
        )
        return reports, backend_of(vec)
    # Ray encodes every row (--full is what it does anyway), its actors on the path a local build here takes
    from condsearch.scale import RayConfig, ray_index_conditions

    ray = RayConfig(address=params["ray_address"], actors=params["ray_actors"], work_dir=params["ray_work_dir"])
    built = ray_index_conditions(data, conditions, spec, store, backend=params["backend"], config=ray, **build)
    return built.reports, built.runner


def _publish(store: IndexStore, reports: list[BuildReport], store_spec: str) -> None:
    """Publish the indexes just written to the Milvus store_spec names (--store)."""
    from condsearch.scale import export_indexes

    for entry in export_indexes(store, [r.name for r in reports], store_spec):
        click.echo(
            f"condsearch: {entry.manifest.n_vectors} vectors of {entry.manifest.condition!r} -> "
            f"{store_spec} ({entry.collection}, {entry.index_type})",
            err=True,
        )


def _print_reports(
    store: IndexStore, reports: list[BuildReport], n_rows: int, elapsed: float, backend: str, *, as_json: bool
) -> None:
    """Print what each index holds (stdout: a line, or a JSON object with --json), the rate and backend (stderr)."""
    names = [r.name for r in reports]
    for r in reports:
        if r.n_reused or r.n_resumed:
            click.echo(
                f"condsearch: {r.n_encoded} row(s) encoded, {r.n_reused} kept from the last index"
                + (f", {r.n_resumed} resumed" if r.n_resumed else ""),
                err=True,
            )
    rate = n_rows * len(names) / elapsed if elapsed > 0 else float("inf")
    ran = backend  # and the precision, as the manifests record it (one encoder for all)
    for name, report in zip(names, reports, strict=True):
        m = store.read_manifest(name)
        ran = f"{backend} {m.precision}"
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "index": name,
                        "condition": m.condition,
                        "rows": m.n_vectors,
                        "dim": m.dim,
                        "model": m.model_id,
                        "mode": m.mode,
                        "head": m.head,
                        "factory": m.factory,
                        "search_params": m.search_params,
                        "encoded": report.n_encoded,
                        "reused": report.n_reused,
                        "backend": backend,
                        "precision": m.precision,
                        "path": str(store.root / name),
                    },
                    ensure_ascii=False,
                )
            )
        else:
            click.echo(f"indexed {m.n_vectors} rows under {m.condition!r} -> {store.root / name} ({m.dim}-d)")
    total = n_rows * len(names)
    kept = sum(r.n_reused for r in reports)
    encoded = sum(r.n_encoded for r in reports)
    if kept and not encoded:  # a re-run on an unchanged corpus: no rate of nothing (issue 59)
        under = f"{len(names)} condition{'s' if len(names) != 1 else ''}"
        click.echo(
            f"condsearch: nothing to encode: all {n_rows} rows already indexed under {under} ({elapsed:.1f}s)",
            err=True,
        )
    elif kept:  # say what was encoded, not that every pair was, and the rate of what was
        rate = encoded / elapsed if elapsed > 0 else float("inf")
        summary = f"{encoded} encoded on {ran} ({rate:.0f} pairs/s), {kept} kept from the last index"
        click.echo(f"condsearch: {total} pairs in {elapsed:.1f}s: {summary}", err=True)
    else:
        click.echo(f"condsearch: {total} pairs in {elapsed:.1f}s ({rate:.0f} pairs/s, encoded on {ran})", err=True)
