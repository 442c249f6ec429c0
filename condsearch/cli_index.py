"""`condsearch index`: encode a corpus under each condition into stored indexes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from condsearch.ann import AUTO, IndexConfig, parse_factory, parse_search_params
from condsearch.cli_options import (
    device_option,
    encoder_options,
    index_dir_option,
    mode_option,
    profile_options,
    quantize_option,
    router_options,
    threads_option,
    trust_option,
)
from condsearch.cli_scale import index_store_option, ray_options
from condsearch.corpus_formats import FORMATS, CorpusConfig
from condsearch.errors import CondsearchError

if TYPE_CHECKING:
    from condsearch.pipeline import Vectorizer

from condsearch.cli_common import CONTEXT, fail, open_store


def _check_index_options(factory: str, search_params: str) -> None:
    """Refuse a factory string or search parameters of an unsupported form before any model loads."""
    try:
        if factory != AUTO:
            parse_factory(factory)
        parse_search_params(search_params)
    except ValueError as exc:
        raise CondsearchError(str(exc)) from exc


@click.command("index", context_settings=CONTEXT)
@click.argument("corpus", type=click.Path(path_type=Path))
@click.option(
    "-c",
    "--condition",
    "conditions",
    multiple=True,
    required=True,
    help="Condition to index under; repeat for several.",
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
@click.option("--name", "corpus_name", default=None, help="Corpus name in the store [default: the file's stem].")
@click.option(
    "--model", default=None, help="Model id or local folder [default: sentence-transformers/all-MiniLM-L6-v2]."
)
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
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1), help="Pairs per forward pass.")
@click.option(
    "--max-length", default=None, type=click.IntRange(min=8), help="Token limit per input [default: the model's]."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per index written.")
@mode_option
@router_options
@encoder_options
@quantize_option
@threads_option
@index_dir_option
@device_option
@trust_option
@ray_options
@index_store_option
def index_cmd(
    corpus: Path,
    conditions: tuple[str, ...],
    corpus_format: str | None,
    text_column: str,
    id_column: str | None,
    corpus_name: str | None,
    model: str | None,
    profile: str | None,
    adapter: Path | None,
    head: str | None,
    index_factory: str,
    search_params: str,
    max_index_memory: str,
    full: bool,
    batch_size: int,
    max_length: int | None,
    as_json: bool,
    pooling: str,
    prompt_template: str | None,
    unconditional_template: str | None,
    dtype: str,
    bidirectional_layers: int | None,
    preset: str | None,
    mode: str,
    router: str,
    router_layer: int | None,
    router_variant: str | None,
    index_dir: Path,
    device: str | None,
    trust_remote_code: bool,
    quantize: str,
    threads: int | None,
    ray_address: str | None,
    ray_actors: int | None,
    ray_work_dir: Path | None,
    store_spec: str | None,
) -> None:
    """Encode CORPUS (parquet, CSV or JSON lines) under each condition and store one index per condition.

    Re-indexing the same corpus under the same condition replaces its index atomically, and
    encodes only rows that are new or whose text, encoder, adapter, head or router changed
    (rows are matched by id); the old index answers until the new one is in. The corpus is
    read and encoded in chunks, and an interrupted run resumes after its last finished chunk.
    With --mode csr, sentence states are cached once (env CONDSEARCH_CACHE_DIR), so each
    further condition costs only the router's per-pair remainder. --ray encodes on Ray Data
    (actors on workers and GPUs); --store also publishes the indexes to Milvus.
    """
    from condsearch.corpus import scan_corpus
    from condsearch.pipeline import check_condition, index_conditions, load_csr_vectorizer, load_vectorizer

    if mode == "csr" and (bidirectional_layers is not None or preset is not None):
        raise click.UsageError("--bidirectional-layers and --preset apply to --mode case (decoder embedders)")
    if mode == "csr" and (pooling != "auto" or prompt_template or unconditional_template or dtype != "auto"):
        # the router tri-encoder pools and runs its own way: these would be silently dropped
        raise click.UsageError(
            "--pooling, --prompt-template, --unconditional-template and --dtype apply to --mode case"
        )
    if mode == "csr" and quantize != "none":
        raise click.UsageError("--quantize applies to --mode case (the CSR remainder stays float32)")
    if mode == "case" and (router != "auto" or router_layer is not None or router_variant is not None):
        raise click.UsageError("--router, --router-layer and --router-variant apply to --mode csr")
    try:
        for c in conditions:
            check_condition(c)
        _check_index_options(index_factory, search_params)
        data = scan_corpus(corpus, text_column, id_column, format=corpus_format)
        if data.n_skipped:
            click.echo(f"condsearch: skipped {data.n_skipped} null or blank text(s)", err=True)
        load: Callable[..., Vectorizer]
        options: dict[str, Any]
        if mode == "csr":
            from condsearch.encoders.cpu import apply_threads

            apply_threads(threads)
            load, options = (
                load_csr_vectorizer,
                dict(
                    model=model,
                    head=head,
                    adapter=adapter,
                    profile=profile,
                    router=router,
                    router_layer=router_layer,
                    router_variant=router_variant,
                    device=device,
                    max_length=max_length,
                    trust_remote_code=trust_remote_code,
                ),
            )
        else:
            load, options = (
                load_vectorizer,
                dict(
                    model=model,
                    head=head,
                    adapter=adapter,
                    profile=profile,
                    device=device,
                    max_length=max_length,
                    trust_remote_code=trust_remote_code,
                    pooling=pooling,
                    prompt_template=prompt_template,
                    unconditional_template=unconditional_template,
                    dtype=dtype,
                    bidirectional_layers=bidirectional_layers,
                    preset=preset,
                    quantize=quantize,
                    threads=threads,
                ),
            )
        store = open_store(index_dir)
        start = time.perf_counter()
        build: dict[str, Any] = dict(
            corpus_name=corpus_name or corpus.stem,
            factory=index_factory,
            search_params=search_params,
            max_index_memory=max_index_memory,
            full=full,
            batch_size=batch_size,
            progress=True,
        )
        if ray_address is None:
            reports = index_conditions(data, conditions, load(**options), store, **build)
        else:
            from condsearch.cli_scale import ray_index

            reports = ray_index(
                data,
                conditions,
                mode,
                options,
                store,
                address=ray_address,
                actors=ray_actors,
                work_dir=ray_work_dir,
                **build,
            )
        elapsed = time.perf_counter() - start
        if store_spec is not None:
            from condsearch.cli_scale import publish_to_milvus

            publish_to_milvus(store, [r.name for r in reports], store_spec)
    except CondsearchError as exc:
        raise fail(exc) from exc
    names = [r.name for r in reports]
    for r in reports:
        if r.n_reused or r.n_resumed:
            click.echo(
                f"condsearch: {r.n_encoded} row(s) encoded, {r.n_reused} kept from the last index"
                + (f", {r.n_resumed} resumed" if r.n_resumed else ""),
                err=True,
            )
    rate = len(data) * len(names) / elapsed if elapsed > 0 else float("inf")
    for name, report in zip(names, reports, strict=True):
        m = store.read_manifest(name)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "index": name,
                        "condition": m.condition,
                        "rows": m.n_vectors,
                        "dim": m.dim,
                        "model": m.model_id,
                        "head": m.head,
                        "factory": m.factory,
                        "search_params": m.search_params,
                        "encoded": report.n_encoded,
                        "reused": report.n_reused,
                        "path": str(store.root / name),
                    },
                    ensure_ascii=False,
                )
            )
        else:
            click.echo(f"indexed {m.n_vectors} rows under {m.condition!r} -> {store.root / name} ({m.dim}-d)")
    click.echo(f"condsearch: {len(data) * len(names)} pairs in {elapsed:.1f}s ({rate:.0f} pairs/s)", err=True)
