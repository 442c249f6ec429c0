"""The command line: a thin shell over condsearch.pipeline and condsearch.training."""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from condsearch import __version__
from condsearch.ann import IndexConfig
from condsearch.cli_options import (
    device_option,
    encoder_options,
    index_dir_option,
    mode_option,
    profile_options,
    quantize_check_option,
    quantize_option,
    router_options,
    threads_option,
    trust_option,
)
from condsearch.cli_scale import export_cmd, index_store_option, query_store_option, ray_options
from condsearch.cli_train import train
from condsearch.errors import CondsearchError, first_line, os_reason
from condsearch.progress import set_quiet
from condsearch.serve.config import API_KEY_ENV, ServeConfig, is_loopback

if TYPE_CHECKING:
    from condsearch.pipeline import Vectorizer

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _fail(exc: CondsearchError) -> click.ClickException:
    from condsearch.artifacts.profiles import ProfileError

    if isinstance(exc, ProfileError):  # flags that cannot go together: a usage error (exit 2)
        return click.UsageError(first_line(exc))
    return click.ClickException(first_line(exc))


class _Commands(click.Group):
    """The command group; an OSError (permission denied, disk full) on any path ends as one line, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # click ends quietly when stdout's reader goes away
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename is not None and exc.strerror else ""
            raise click.ClickException(where + os_reason(exc)) from exc


def _store(index_dir: Path | None):  # noqa: ANN202 - import kept lazy for a fast --help
    from condsearch.store import IndexStore

    return IndexStore(index_dir)


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="condsearch")
@click.option("-v", "--verbose", is_flag=True, help="Log more detail to stderr.")
@click.option("-q", "--quiet", is_flag=True, help="Draw no progress bars (they are drawn only on a terminal anyway).")
def main(verbose: bool, quiet: bool) -> None:
    """Conditional semantic search: index texts under a natural-language condition, query them.

    \b
    condsearch index corpus.parquet --condition "color of the dress"
    condsearch query "a girl in an orange dress" --condition "color of the dress"
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="condsearch: %(message)s", stream=sys.stderr
    )
    set_quiet(quiet)
    _quiet_transformers()


def _quiet_transformers() -> None:
    # transformers costs about a second to import: commands that never load a model (list,
    # serve's startup, --help) must not pay for it, so it is told by environment when not yet loaded.
    if "transformers" not in sys.modules:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@main.command("index", context_settings=CONTEXT)
@click.argument("corpus", type=click.Path(path_type=Path))
@click.option(
    "-c",
    "--condition",
    "conditions",
    multiple=True,
    required=True,
    help="Condition to index under; repeat for several.",
)
@click.option("--text-column", default="text", show_default=True, help="Column holding the texts.")
@click.option(
    "--id-column", default=None, help="Column holding unique ids [default: 'id' if present, else row number]."
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
    """Encode CORPUS (parquet) under each condition and store one index per condition.

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
    if mode == "csr" and quantize != "none":
        raise click.UsageError("--quantize applies to --mode case (the CSR remainder stays float32)")
    if mode == "case" and (router != "auto" or router_layer is not None or router_variant is not None):
        raise click.UsageError("--router, --router-layer and --router-variant apply to --mode csr")
    try:
        for c in conditions:
            check_condition(c)
        data = scan_corpus(corpus, text_column, id_column)
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
        store = _store(index_dir)
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
        raise _fail(exc) from exc
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


def _read_queries(texts: tuple[str, ...], query_file: Path | None) -> list[str]:
    queries: list[str] = []
    for t in texts:
        queries.extend(line for line in sys.stdin.read().splitlines() if line.strip()) if t == "-" else queries.append(
            t
        )
    if query_file is not None:
        try:
            queries.extend(line for line in query_file.read_text(encoding="utf-8").splitlines() if line.strip())
        except (OSError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{query_file}: cannot read queries ({type(exc).__name__})") from exc
    if not queries:
        raise click.UsageError("give a query TEXT, '-' for stdin, or --file")
    return queries


def _quick_exit() -> None:
    # Python's shutdown collects every object torch created (165k): 0.6 s here, more than a query
    # costs. Frozen objects are skipped; freezing at exit (not now) keeps an in-process caller's
    # garbage collectable. unregister first: registered once however often the command runs.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


#: up to this many queries, one forward pass is too small to share between threads
_FEW_QUERIES = 16


def _one_thread() -> None:
    # Waking torch's thread pool for a few short inputs costs more than the work, and on a busy
    # machine far more (1.9 s instead of 0.05 s for one query here). An explicit setting wins.
    if not os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(1)


@main.command("query", context_settings=CONTEXT)
@click.argument("texts", nargs=-1)
@click.option("-c", "--condition", required=True, help="Condition whose index to search.")
@click.option(
    "-k", "k", default=ServeConfig.k, show_default=True, type=int, help="Results per query (all rows if fewer)."
)
@click.option(
    "-f",
    "--file",
    "query_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read one query per line from a file.",
)
@click.option("--corpus", "corpus_name", default=None, help="Corpus name, when several corpora share the condition.")
@click.option("--model", default=None, help="Must match the index's model [default: the index's].")
@click.option("--head", default=None, help="Must match the index's head [default: the index's].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per query: query, condition, results.")
@quantize_check_option
@threads_option
@index_dir_option
@device_option
@trust_option
@query_store_option
def query_cmd(
    texts: tuple[str, ...],
    condition: str,
    k: int,
    query_file: Path | None,
    corpus_name: str | None,
    model: str | None,
    head: str | None,
    as_json: bool,
    index_dir: Path,
    device: str | None,
    trust_remote_code: bool,
    quantize: str | None,
    threads: int | None,
    store_spec: str | None,
) -> None:
    """Search the index of CONDITION for each TEXT ('-' reads queries from stdin, one per line)."""
    from condsearch.pipeline import cache_onnx_export, check_condition, onnx_vectorizer_for, query_index, vectorizer_for
    from condsearch.serve.answers import capped_k, k_notice, query_answer

    queries = _read_queries(texts, query_file)
    if k <= 0:
        raise click.UsageError(f"-k must be positive, got {k}")
    few = len(queries) <= _FEW_QUERIES

    def checked(manifest: Any) -> Any:  # the model, head, adapter and router checks, for either store
        return vectorizer_for(
            manifest,
            model,
            head,
            device=device,
            trust_remote_code=trust_remote_code,
            quantize=quantize,
            threads=threads,
        )

    if store_spec is not None:
        from condsearch.cli_scale import milvus_query

        try:
            manifest, answers = milvus_query(store_spec, condition, corpus_name, queries, k, checked)
        except CondsearchError as exc:
            raise _fail(exc) from exc
        _print_answers(answers, manifest.condition, as_json)
        return
    try:
        store = _store(index_dir)
        stored = store.load(store.find(check_condition(condition), corpus_name))
        # A few queries on the CPU skip torch (its import costs more than they do) where onnxruntime
        # can run the index's own model; otherwise, and for any override, torch loads it.
        light = few and model is None and head is None and quantize is None and device in (None, "cpu")
        vec = onnx_vectorizer_for(stored.manifest) if light else None
        on_device = vec is None  # the onnxruntime path searches on the CPU too, without importing torch to ask
        if vec is None:
            if few and threads is None:
                _one_thread()
            vec = checked(stored.manifest)
        notice = k_notice(k, stored.manifest.n_vectors)
        if notice:
            click.echo(f"condsearch: {notice}", err=True)
        result = query_index(stored, vec, queries, capped_k(k, stored.manifest.n_vectors), on_device=on_device)
    except CondsearchError as exc:
        raise _fail(exc) from exc
    answers = [
        query_answer(q, stored.manifest.condition, result.scores[qi], result.ids[qi], stored.ids, stored.texts)
        for qi, q in enumerate(queries)
    ]
    _print_answers(answers, stored.manifest.condition, as_json)
    if light and on_device:  # torch answered: its ONNX export lets the next such query skip torch
        cache_onnx_export(stored.manifest, vec)
    _quick_exit()


def _print_answers(answers: list[dict[str, Any]], condition: str, as_json: bool) -> None:
    for qi, answer in enumerate(answers):
        if as_json:
            click.echo(json.dumps(answer, ensure_ascii=False))
            continue
        click.echo(f"query: {answer['query']}\ncondition: {condition}")
        for row in answer["results"]:
            click.echo(f"{row['rank']:>4}  {row['score']:.4f}  {row['id']}  {row['text']}")
        if qi + 1 < len(answers):
            click.echo("")


@main.command("list", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per index.")
@index_dir_option
def list_cmd(as_json: bool, index_dir: Path) -> None:
    """List the stored indexes: condition, rows, model, head, dimension."""
    from condsearch.serve.answers import index_summary
    from condsearch.store import Manifest

    entries = _store(index_dir).manifests()
    if not entries and not as_json:
        click.echo(f"no indexes in {index_dir}", err=True)
    for name, m in entries:
        if as_json:
            click.echo(json.dumps(index_summary(name, m), ensure_ascii=False))
        elif not isinstance(m, Manifest):
            click.echo(f"{name}: unreadable ({m})")
        else:
            click.echo(
                f"{m.condition!r}  corpus={m.corpus_name}  mode={m.mode}  rows={m.n_vectors}  model={m.model_id}  "
                f"head={m.head}  dim={m.dim}  [{name}]"
            )


@main.command("verify", context_settings=CONTEXT)
@click.option(
    "-c", "--condition", "conditions", multiple=True, help="Verify this condition's index [default: every index]."
)
@click.option("--corpus", "corpus_name", default=None, help="Corpus name, when several corpora share the condition.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per index: index, condition, ok, rows or error.")
@index_dir_option
def verify_cmd(conditions: tuple[str, ...], corpus_name: str | None, as_json: bool, index_dir: Path) -> None:
    """Check indexes in full against their manifests: the sha256 of each index file, its rows, the counts.

    Loading an index (query, serve) checks the index file's size, modification time and first and
    last 64 KiB only; this reads every byte. Exits 1 when any index fails.
    """
    if corpus_name is not None and not conditions:
        raise click.UsageError("--corpus picks among the indexes of a --condition")
    store = _store(index_dir)
    try:
        names = list(dict.fromkeys(store.find(c, corpus_name) for c in conditions)) if conditions else store.names()
    except CondsearchError as exc:
        raise _fail(exc) from exc
    if not names and not as_json:
        click.echo(f"no indexes in {index_dir}", err=True)
    failed = 0
    for name in names:
        try:
            m = store.verify(name)
            entry: dict[str, Any] = {"index": name, "condition": m.condition, "ok": True, "rows": m.n_vectors}
        except CondsearchError as exc:
            failed += 1
            entry = {"index": name, "ok": False, "error": first_line(exc)}
        if as_json:
            click.echo(json.dumps(entry, ensure_ascii=False))
        elif entry["ok"]:
            click.echo(f"ok      {entry['condition']!r}  rows={entry['rows']}  [{name}]")
        else:
            click.echo(f"FAILED  [{name}]  {entry['error']}")
    if failed:
        raise click.ClickException(f"{failed} of {len(names)} index(es) failed verification")


@main.command("demo-corpus", context_settings=CONTEXT)
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
def demo_corpus_cmd(out: Path) -> None:
    """Write the bundled demo corpus (captions varying colour, sport, place, …) to OUT as parquet."""
    from condsearch.demo import write_demo_corpus

    try:
        n = write_demo_corpus(out)
    except OSError as exc:
        raise click.ClickException(f"{out}: cannot write ({os_reason(exc)})") from exc
    click.echo(f"wrote {n} rows to {out}")


@main.command("serve", context_settings=CONTEXT)
@click.option(
    "--host",
    default=ServeConfig.host,
    show_default=True,
    help="Address to listen on (one that is not loopback prints a warning).",
)
@click.option("--port", default=ServeConfig.port, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option(
    "--api-key",
    envvar=API_KEY_ENV,
    default=None,
    help=f"Require this key on every request (header X-API-Key or a Bearer token); prefer env {API_KEY_ENV}.",
)
@click.option(
    "--max-batch",
    default=ServeConfig.max_batch,
    show_default=True,
    type=click.IntRange(min=1),
    help="Queries encoded together at most (requests that arrive together share one forward pass).",
)
@click.option(
    "--batch-window-ms",
    default=ServeConfig.batch_window_ms,
    show_default=True,
    type=click.FloatRange(min=0),
    help="How long a batch waits for more requests after its first.",
)
@click.option("--preload", is_flag=True, help="Load every index and its model before answering (else on first use).")
@quantize_check_option
@threads_option
@index_dir_option
@device_option
@trust_option
def serve_cmd(
    host: str,
    port: int,
    api_key: str | None,
    max_batch: int,
    batch_window_ms: float,
    preload: bool,
    index_dir: Path,
    device: str | None,
    trust_remote_code: bool,
    quantize: str | None,
    threads: int | None,
) -> None:
    """Answer queries over HTTP (JSON): POST /query, GET /indexes, GET /health, docs at /docs.

    Each model is loaded once and shared by the indexes built with it; indexes load on first use
    and stay resident, and an index that `condsearch index` replaces is reloaded without a restart.
    """
    try:
        from condsearch.serve.server import run_server
    except ImportError as exc:
        raise click.ClickException(f"serve needs {exc.name}: pip install 'condsearch[serve]'") from exc
    if not is_loopback(host):
        click.echo(
            f"condsearch: warning: listening on {host}: other machines can query this server"
            + ("" if api_key else f"; set --api-key or {API_KEY_ENV}"),
            err=True,
        )
    config = ServeConfig(
        index_dir=index_dir,
        host=host,
        port=port,
        api_key=api_key or None,
        device=device,
        trust_remote_code=trust_remote_code,
        max_batch=max_batch,
        batch_window_ms=batch_window_ms,
        preload=preload,
        quantize=quantize,
        threads=threads,
    )
    try:
        run_server(config)
    except CondsearchError as exc:
        raise _fail(exc) from exc


main.add_command(export_cmd)
main.add_command(train)

if __name__ == "__main__":
    main()
