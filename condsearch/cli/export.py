"""`condsearch export`: push FAISS indexes to Milvus (the work is condsearch.scale.export's)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from condsearch.cli.common import CONTEXT
from condsearch.cli.options import export_target_option, index_dir_option
from condsearch.errors import CondsearchError, first_line


@click.command("export", context_settings=CONTEXT)
@export_target_option
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
    from condsearch.scale import export_indexes
    from condsearch.store import IndexStore

    if corpus_name is not None and not conditions:
        raise click.UsageError("--corpus picks among the indexes of a --condition")
    store = IndexStore(index_dir)
    try:
        names = store.select(conditions, corpus_name)
        if not names:
            raise CondsearchError(f"no indexes in {index_dir}")
        for entry, name in zip(export_indexes(store, names, spec), names, strict=True):  # first: it closes Milvus
            m = entry.manifest
            if as_json:
                row = {"index": name, "condition": m.condition, "rows": m.n_vectors, "collection": entry.collection}
                click.echo(json.dumps({**row, "index_type": entry.index_type, "store": spec}, ensure_ascii=False))
            else:
                click.echo(f"exported {m.n_vectors} rows under {m.condition!r} -> {spec} ({entry.collection})")
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc
