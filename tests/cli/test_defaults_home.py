"""Every default has one home (STYLE 12): each CLI option's default is read from the config or constant that holds it.

Three nets: the options built by a helper follow their home when it moves (the home is patched and the
option rebuilt); every option of index, query, serve and train that has a home shows that home's value;
and no click option in condsearch/cli spells its default as a literal (a second copy that a moved home
would leave behind). The router variants and a query's k are checked to have one home each too.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
import pytest

from condsearch.base.ann import IndexConfig
from condsearch.cli import main
from condsearch.cli.options import backend_option, encoder_options, quantize_option, threads_option
from condsearch.corpus.formats import CorpusConfig
from condsearch.defaults import DEFAULT_INDEX_DIR
from condsearch.model.artifacts.profiles import DEFAULT_MODE
from condsearch.model.artifacts.routers import ROUTER_AUTO
from condsearch.model.csr import variants
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE
from condsearch.model.encoders.cpu import CpuConfig
from condsearch.model.encoders.family import DecoderAttention
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.query.config import QueryConfig
from condsearch.serve.config import ServeConfig

CLI_DIR = Path(__file__).resolve().parents[2] / "condsearch" / "cli"


def _command(*path: str) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)  # train's subcommands load on first use
        assert found is not None, path
        command = found
    return command


def _options(command: click.Command) -> dict[str, click.Option]:
    return {str(p.name): p for p in command.params if isinstance(p, click.Option)}


def _defaults(command: click.Command) -> dict[str, object]:
    """Return each option's default as the command sees it (a flag's False too), by name."""
    ctx = click.Context(command)
    return {name: option.get_default(ctx, call=False) for name, option in _options(command).items()}


def _declared(decorator: Callable[[], Callable[[Any], Any]]) -> dict[str, click.Option]:
    """Return the options that a helper of condsearch.cli.options declares, by name, the helper called now."""

    def command(**_: Any) -> None:
        pass

    return {str(p.name): p for p in decorator()(command).__click_params__ if isinstance(p, click.Option)}


# ----------------------------------------------------------------- a moved home moves the option


@pytest.mark.parametrize(
    ("home", "field", "decorator"),
    [
        (EncoderSpec, "pooling", lambda: encoder_options),
        (EncoderSpec, "dtype", lambda: encoder_options),
        (DecoderAttention, "bidirectional_layers", lambda: encoder_options),
        (CpuConfig, "backend", lambda: backend_option("help")),
        (CpuConfig, "threads", lambda: threads_option),
        (CpuConfig, "quantize", lambda: quantize_option),
    ],
    ids=["pooling", "dtype", "bidirectional_layers", "backend", "threads", "quantize"],
)
def test_an_option_follows_its_home_when_the_home_changes(
    monkeypatch: pytest.MonkeyPatch, home: type, field: str, decorator: Callable[[], Callable[[Any], Any]]
) -> None:
    monkeypatch.setattr(home, field, "moved")
    assert _declared(decorator)[field].default == "moved"


# ----------------------------------------------------------------- each command shows its home's value

#: (command path, option name, its home's value): the options whose default lives in a config or constant
HOMES: list[tuple[tuple[str, ...], str, object]] = [
    (("index",), "pooling", EncoderSpec.pooling),
    (("index",), "dtype", EncoderSpec.dtype),
    (("index",), "quantize", EncoderSpec.quantize),
    (("index",), "max_length", EncoderSpec.max_length),
    (("index",), "router", ROUTER_AUTO),
    (("index",), "mode", DEFAULT_MODE),
    (("index",), "bidirectional_layers", DecoderAttention.bidirectional_layers),
    (("index",), "backend", CpuConfig.backend),
    (("index",), "threads", Runtime.threads),
    (("index",), "index_factory", IndexConfig.factory),
    (("index",), "search_params", IndexConfig.search_params),
    (("index",), "max_index_memory", IndexConfig.max_index_memory),
    (("index",), "batch_size", ENCODE_BATCH_SIZE),
    (("index",), "text_column", CorpusConfig.text_column),
    (("index",), "id_column", CorpusConfig.id_column),
    (("index",), "corpus_format", CorpusConfig.format),
    (("index",), "index_dir", str(DEFAULT_INDEX_DIR)),
    (("query",), "k", QueryConfig.k),
    (("query",), "threads", Runtime.threads),
    (("pairs",), "text_column", CorpusConfig.text_column),
    (("pairs",), "table_format", CorpusConfig.format),
    (("train", "head"), "pooling", EncoderSpec.pooling),
    (("train", "head"), "dtype", EncoderSpec.dtype),
    (("train", "head"), "encode_batch_size", ENCODE_BATCH_SIZE),
    (("train", "lora"), "pooling", EncoderSpec.pooling),
    (("train", "router"), "variant", variants.DEFAULT_VARIANT),
]


@pytest.mark.parametrize(("path", "name", "value"), HOMES, ids=[f"{' '.join(p)} {n}" for p, n, _ in HOMES])
def test_each_option_shows_its_homes_default(path: tuple[str, ...], name: str, value: object) -> None:
    assert _defaults(_command(*path))[name] == value


#: index's options named like an EncoderSpec field whose default is not the field's, and why
_NOT_THE_SPECS = {
    "mode": "--mode auto resolves to a mode; a spec holds a resolved one",
    "router": "auto, which the spec leaves as None: both let the model pick its router",
    "bidirectional_layers": "DecoderAttention's, passed on as None (unset) so that a preset or adapter may set it",
}


def test_every_index_option_named_like_a_spec_field_has_its_default() -> None:
    defaults = _defaults(_command("index"))
    shared = [f for f in fields(EncoderSpec) if f.name in defaults and f.name not in _NOT_THE_SPECS]
    assert len(shared) >= 10
    assert {f.name: defaults[f.name] for f in shared} == {f.name: f.default for f in shared}


def test_every_serve_option_named_like_a_serve_config_field_has_its_default() -> None:
    defaults = _defaults(_command("serve"))
    shared = [f for f in fields(ServeConfig) if f.name in defaults]
    assert len(shared) >= 15
    shown = {f.name: defaults[f.name] for f in shared}
    shown["index_dir"] = Path(str(shown["index_dir"]))  # click takes the folder as text
    assert shown == {f.name: f.default for f in shared}


# ----------------------------------------------------------------- no literal defaults in the CLI

#: (file under condsearch/cli, flag) whose literal default is a sentinel with no home to read, and why
_LITERAL_ALLOWED = {
    ("train/router.py", "--checkpoint-every"): "0 is 'off' (the training functions' own keyword default)",
    ("train/finetune.py", "--checkpoint-every"): "0 is 'off' (the training functions' own keyword default)",
}


def _literal_defaults() -> list[tuple[str, str, object]]:
    """Return (file, flag, value) for each click.option in condsearch/cli whose default is a literal but None/a bool."""
    found = []
    for path in sorted(CLI_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "click.option"):
                continue
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
            for keyword in node.keywords:
                value = keyword.value
                literal = isinstance(value, ast.Constant) and not isinstance(value.value, bool | None)
                if keyword.arg == "default" and literal:
                    found.append((path.relative_to(CLI_DIR).as_posix(), flags[-1] if flags else "?", value.value))
    return found


def test_no_cli_option_spells_its_default_as_a_literal() -> None:
    literal = [(f, flag, v) for f, flag, v in _literal_defaults() if (f, flag) not in _LITERAL_ALLOWED]
    assert literal == []
    assert {(f, flag) for f, flag, _ in _literal_defaults()} == set(_LITERAL_ALLOWED)  # the allowance is not stale


# ----------------------------------------------------------------- router variants and k: one home each


def test_the_router_variants_have_one_home() -> None:
    from condsearch.model.csr.context import CONTEXT_DEFAULT
    from condsearch.model.csr.router import EXTENDED, PAPER, PRESETS

    for path, name in ((("index",), "router_variant"), (("train", "router"), "variant")):
        option_type = _options(_command(*path))[name].type
        assert isinstance(option_type, click.Choice)
        assert tuple(option_type.choices) == variants.ROUTER_VARIANTS
    assert tuple(PRESETS) == variants.ROUTED_VARIANTS
    assert (PAPER.variant, EXTENDED.variant, CONTEXT_DEFAULT.variant) == variants.ROUTER_VARIANTS
    assert PRESETS[variants.DEFAULT_VARIANT] == PAPER


def test_a_querys_k_has_one_home() -> None:
    from condsearch.api import Store

    assert _defaults(_command("query"))["k"] == QueryConfig.k
    assert ServeConfig().k == QueryConfig.k
    assert inspect.signature(Store.search).parameters["k"].default == QueryConfig.k
