"""`condsearch query`, `list` and `verify`: reading the stored indexes."""

from __future__ import annotations

import atexit
import gc
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from condsearch.cli.common import CONTEXT, check_utf8, confirm_case_variant, fail, json_line, open_store, yes_option
from condsearch.cli.options import (
    device_option,
    index_dir_option,
    quantize_check_option,
    query_profile_option,
    read_store_option,
    refuse_index_dir_beside_store,
    threads_option,
    trust_option,
)
from condsearch.errors import CaseVariant, CondsearchError, UnknownCondition, first_line
from condsearch.query import QueryConfig

if TYPE_CHECKING:
    from condsearch.model.encoders import Runtime
    from condsearch.query import Answer
    from condsearch.store import IndexStore


def _stdin_queries() -> list[str]:
    try:
        return [line for line in sys.stdin.read().splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"stdin: cannot read queries (not valid UTF-8: {exc.reason})") from exc


def _read_queries(texts: tuple[str, ...], query_file: Path | None) -> list[str]:
    from condsearch.base import check_regular_file

    queries: list[str] = []
    for t in texts:
        queries.extend(_stdin_queries() if t == "-" else [t])
    if query_file is not None and str(query_file) == "-":
        queries.extend(_stdin_queries())
    elif query_file is not None:
        try:
            check_regular_file(query_file, CondsearchError)  # /dev/zero never ends; a FIFO blocks
            queries.extend(line for line in query_file.read_text(encoding="utf-8").splitlines() if line.strip())
        except CondsearchError as exc:
            raise click.ClickException(f"cannot read queries from {first_line(exc)}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{query_file}: cannot read queries ({type(exc).__name__})") from exc
    if not queries:
        raise click.UsageError("give a query TEXT, '-' for stdin, or --file")
    return [check_utf8(q, "query") for q in queries]  # a stdin decoded with surrogateescape (C locale)


def _quick_exit() -> None:
    # Python's shutdown collects every object torch created (165k): 0.6 s here, more than a query
    # costs. Frozen objects are skipped; freezing at exit (not now) keeps an in-process caller's
    # garbage collectable. unregister first: registered once however often the command runs.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


@click.command("query", context_settings=CONTEXT)
@click.argument("texts", nargs=-1)
@click.option("-c", "--condition", required=True, help="Condition whose index to search.")
@click.option(
    "-k", "k", default=QueryConfig.k, show_default=True, type=int, help="Results per query (all rows if fewer)."
)
@click.option(
    "-f",
    "--file",
    "query_file",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Read one query per line from a file ('-': stdin); a FIFO or a device is refused.",
)
@click.option("--corpus", "corpus_name", default=None, help="Corpus name, when several corpora share the condition.")
@click.option("--model", default=None, help="Must match the index's model [default: the index's].")
@query_profile_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per query: query, condition, results.")
@click.option(
    "--calibrated",
    is_flag=True,
    help=(
        "Also give each score's z against the index's background (its rows' pair scores, recorded when it was "
        "written): z=3 is 3 standard deviations above a random pair of its rows. The score is unchanged."
    ),
)
@click.option(
    "--where",
    default=None,
    help=(
        "Rank only the rows this SQL condition on the index's kept columns keeps (`index --keep-columns`), e.g. "
        "\"lang = 'en' AND year >= 2020\": comparisons, AND, OR, NOT, IN, BETWEEN, IS NULL, LIKE. Filtered before "
        "ranking; a filter that keeps no row finds nothing."
    ),
)
@click.option(
    "--no-build",
    is_flag=True,
    help=(
        "Refuse a condition that is not indexed. Without it, on a corpus indexed with --mode csr, its index is "
        "built first from the router's cached sentence states (a progress bar on stderr), then answered."
    ),
)
@yes_option
@quantize_check_option
@threads_option
@index_dir_option
@device_option
@trust_option
@read_store_option("Search")
def query_cmd(
    texts: tuple[str, ...],
    condition: str,
    k: int,
    query_file: Path | None,
    corpus_name: str | None,
    model: str | None,
    profile: str | None,
    as_json: bool,
    calibrated: bool,
    where: str | None,
    no_build: bool,
    yes: bool,
    index_dir: Path,
    device: str | None,
    trust_remote_code: bool,
    quantize: str | None,
    threads: int | None,
    store_spec: str | None,
) -> None:
    """Search the index of CONDITION for each TEXT ('-' reads queries from stdin, one per line).

    A condition not yet indexed for a corpus indexed with --mode csr is indexed first, from the
    sentence states the router cached when the corpus was indexed (--no-build refuses instead); one that
    differs from an indexed condition only in case (a cased model's) is built only once confirmed (--yes).
    """
    from condsearch.model import OneShotQuery, load_model_for
    from condsearch.model.encoders import Runtime
    from condsearch.query import Background, answer, filter_rows
    from condsearch.store import FaissIndex

    refuse_index_dir_beside_store(store_spec, "query")
    queries = _read_queries(texts, query_file)
    if k <= 0:
        raise click.UsageError(f"-k must be positive, got {k}")
    runtime = Runtime(device=device, threads=threads, trust_remote_code=trust_remote_code)
    if store_spec is not None:
        from condsearch.query import open_index

        try:
            with open_index(store_spec, condition, corpus_name) as index:
                if calibrated:
                    Background.of(index.manifest)  # refused before the model loads
                filter_rows(index, where)  # refused before the model loads (a Milvus index keeps no columns)
                # the model, head, adapter and router checked against the index's, run by torch
                vec = load_model_for(
                    "plain", index.manifest, runtime=runtime, model=model, profile=profile, quantize=quantize
                )
                found = answer(index, vec, queries, k, calibrated=calibrated, where=where)
        except UnknownCondition as exc:
            cannot = "" if no_build else "; a Milvus store cannot build one on demand: index it into a folder"
            raise click.ClickException(first_line(exc) + cannot) from exc
        except CondsearchError as exc:
            raise fail(exc) from exc
        _print_answers(found, as_json)
        return
    try:
        store = open_store(index_dir)
        stored = store.load(_find_or_build(store, condition, corpus_name, runtime, build=not no_build, yes=yes))
        if calibrated:
            Background.of(stored.manifest)  # refused before any model loads
        searched = FaissIndex.of(stored, on_device=False)
        allowed = filter_rows(searched, where)  # a bad filter is refused before any model loads
        # A few queries on the CPU skip torch where onnxruntime can run the index's own model, and a CASE
        # index's model loads as the server's: the model package's one-shot policy (condsearch.model.loader)
        one_shot = OneShotQuery(len(queries), runtime, model=model, profile=profile, quantize=quantize)
        vec = load_model_for("one_shot", stored.manifest, query=one_shot)
        # the onnxruntime path searches on the CPU too, without importing torch to ask
        on_device = vec.backend == "torch"
        if allowed is None:
            found = answer(FaissIndex.of(stored, on_device=on_device), vec, queries, k, calibrated=calibrated)
        else:  # filtered searches run on the CPU copy (condsearch.base.filtered_search)
            found = answer(searched, vec, queries, k, calibrated=calibrated, where=where)
    except CondsearchError as exc:
        raise fail(exc) from exc
    _print_answers(found, as_json)
    one_shot.cache_export(stored.manifest, vec)  # where torch answered, the export lets the next query skip it
    _quick_exit()


def _find_or_build(
    store: IndexStore, condition: str, corpus_name: str | None, runtime: Runtime, *, build: bool, yes: bool
) -> str:
    """Return the name of condition's index; where it has none, build it on demand first (with ``build``), asking
    first where the corpus is indexed under a condition that differs from it only in case (unless ``yes``)."""
    try:
        return store.find(condition, corpus_name)
    except UnknownCondition as exc:
        if not build:
            raise
        unknown = exc
    from condsearch.query import OnDemand, build_on_demand

    def say(line: str) -> None:
        click.echo(f"condsearch: {line}", err=True)

    def build_it(case_variants: bool) -> OnDemand:
        return build_on_demand(
            store,
            condition,
            corpus_name,
            runtime=runtime,
            progress=True,
            notice=say,
            announce=say,
            unknown=unknown,
            case_variants=case_variants,
        )

    start = time.perf_counter()
    try:
        made = build_it(yes)
    except CaseVariant as exc:  # refused before the model loads: ask, then build
        confirm_case_variant(exc, condition)
        start = time.perf_counter()
        made = build_it(True)
    if made.built:
        elapsed = time.perf_counter() - start
        say(f"indexed {made.n_rows} rows under {condition!r} in {elapsed:.1f}s -> {store.root / made.name}")
    return made.name


def _print_answers(found: Answer, as_json: bool) -> None:
    """Print the k notice (stderr), then each query's results: a JSON line, or rank, score, id and text.

    Calibrated hits carry their z too (``"z"``; ``z=+3.12`` after the score).
    """
    from condsearch.query import query_answer

    if found.notice:
        click.echo(f"condsearch: {found.notice}", err=True)
    answers = [query_answer(h) for h in found.hits]
    for qi, answer in enumerate(answers):
        if as_json:
            click.echo(json_line(answer))
            continue
        click.echo(f"query: {answer['query']}\ncondition: {answer['condition']}")
        for row in answer["results"]:
            z = f"  z={row['z']:+.2f}" if "z" in row else ""
            kept = "  " + json_line(row["metadata"]) if row.get("metadata") else ""
            click.echo(f"{row['rank']:>4}  {row['score']:.4f}{z}  {row['id']}  {row['text']}{kept}")
        if qi + 1 < len(answers):
            click.echo("")


@click.command("list", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per index.")
@index_dir_option
def list_cmd(as_json: bool, index_dir: Path) -> None:
    """List the stored indexes: condition, rows, model, head, dimension."""
    from condsearch.query import index_summary
    from condsearch.store import Manifest

    entries = open_store(index_dir).manifests()
    if not entries and not as_json:
        click.echo(f"no indexes in {index_dir}", err=True)
    for name, m in entries:
        if as_json:
            click.echo(json_line(index_summary(name, m)))
        elif not isinstance(m, Manifest):
            click.echo(f"{name}: unreadable ({m})")
        else:
            click.echo(
                f"{m.condition!r}  corpus={m.corpus_name}  mode={m.mode}  rows={m.n_vectors}  model={m.model_id}  "
                f"head={m.head}  dim={m.dim}  [{name}]"
            )


@click.command("verify", context_settings=CONTEXT)
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
    store = open_store(index_dir)
    try:
        names = store.select(conditions, corpus_name)
    except CondsearchError as exc:
        raise fail(exc) from exc
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
            click.echo(json_line(entry))
        elif entry["ok"]:
            click.echo(f"ok      {entry['condition']!r}  rows={entry['rows']}  [{name}]")
        else:
            click.echo(f"FAILED  [{name}]  {entry['error']}")
    if failed:
        raise click.ClickException(f"{failed} of {len(names)} index(es) failed verification")
