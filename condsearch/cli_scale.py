"""The CLI's scale-out parts: --ray and --store on index, --store on query and serve, and the export command.

Kept apart from cli.py (as cli_finetune.py is); Ray and pymilvus are imported only when used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from condsearch.cli_options import index_dir_option
from condsearch.errors import CondsearchError, first_line
from condsearch.scale.config import RayConfig, check_address

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
    from condsearch.scale.lite import check_lite_path
    from condsearch.scale.milvus import parse_store

    try:
        target = parse_store(value)
        if target is not None and target.lite:
            check_lite_path(value, target.uri, create=create)
    except CondsearchError as exc:
        raise click.BadParameter(first_line(exc).partition(": ")[2], ctx, param) from exc
    return value


def _read_store_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return _store_spec(ctx, param, value, create=False)


def ray_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add --ray [ADDRESS], --ray-actors and --ray-work-dir to index."""
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
    for option in reversed(options):
        command = option(command)
    return command


index_store_option = click.option(
    "--store",
    "store_spec",
    default=None,
    callback=_store_spec,
    help=f"Also publish each index to Milvus: {STORE_FORMS}; the FAISS copy in --index-dir stays.",
)
query_store_option = click.option(
    "--store",
    "store_spec",
    default=None,
    callback=_read_store_spec,
    help=f"Search indexes in Milvus instead of --index-dir: {STORE_FORMS}.",
)
serve_store_option = click.option(
    "--store",
    "store_spec",
    default=None,
    callback=_read_store_spec,
    help=f"Serve the indexes in Milvus instead of --index-dir: {STORE_FORMS}.",
)


def ray_index(
    corpus: Any,
    conditions: Sequence[str],
    mode: str,
    loader_options: dict[str, Any],
    store: Any,
    *,
    address: str,
    actors: int | None,
    work_dir: Path | None,
    **build: Any,
) -> list[Any]:
    """Index on Ray with the loader options the local path would load the vectorizer with."""
    from condsearch.scale.ray_encode import VectorizerRecipe, ray_index_conditions

    build.pop("full", None)  # Ray encodes every row
    build.pop("progress", None)
    config = RayConfig(address=address, actors=actors, work_dir=work_dir)
    recipe = VectorizerRecipe.of(mode, **loader_options)
    return ray_index_conditions(corpus, conditions, recipe, store, config=config, **build)


def publish_to_milvus(store: Any, names: Sequence[str], spec: str) -> None:
    """Push the named FAISS indexes to the Milvus that spec names; say where each went (stderr)."""
    from condsearch.scale.export import export_index
    from condsearch.scale.milvus import MilvusStore, parse_store

    target = parse_store(spec)
    assert target is not None
    milvus = MilvusStore(target)
    try:
        for name in names:
            entry = export_index(store, name, milvus)
            click.echo(
                f"condsearch: {entry.manifest.n_vectors} vectors of {entry.manifest.condition!r} -> "
                f"{spec} ({entry.collection}, {entry.index_type})",
                err=True,
            )
    finally:
        milvus.close()


@click.command("export", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--to", "spec", required=True, callback=_store_spec, help=f"Where to: {STORE_FORMS}.")
@click.option(
    "-c", "--condition", "conditions", multiple=True, help="Export this condition's index [default: every index]."
)
@click.option("--corpus", "corpus_name", default=None, help="Corpus name, when several corpora share the condition.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per index exported.")
@index_dir_option
def export_cmd(spec: str, conditions: tuple[str, ...], corpus_name: str | None, as_json: bool, index_dir: Path) -> None:
    """Push FAISS indexes from --index-dir to Milvus (condsearch[milvus]), replacing those conditions' vectors.

    One collection per corpus and model/head holds every condition's vectors; the index's
    manifest goes with them, so query --store checks the model, head, adapter and router as
    for FAISS. A condition's vectors are replaced atomically: readers see the old or the new.
    """
    from condsearch.scale.export import export_index
    from condsearch.scale.milvus import MilvusStore, parse_store
    from condsearch.store import IndexStore

    if corpus_name is not None and not conditions:
        raise click.UsageError("--corpus picks among the indexes of a --condition")
    store = IndexStore(index_dir)
    target = parse_store(spec)
    assert target is not None
    milvus = MilvusStore(target)
    try:
        names = list(dict.fromkeys(store.find(c, corpus_name) for c in conditions)) if conditions else store.names()
        if not names:
            raise CondsearchError(f"no indexes in {index_dir}")
        for name in names:
            entry = export_index(store, name, milvus)
            m = entry.manifest
            if as_json:
                row = {"index": name, "condition": m.condition, "rows": m.n_vectors, "collection": entry.collection}
                click.echo(json.dumps({**row, "index_type": entry.index_type, "store": spec}, ensure_ascii=False))
            else:
                click.echo(f"exported {m.n_vectors} rows under {m.condition!r} -> {spec} ({entry.collection})")
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc
    finally:
        milvus.close()
