"""Every option of every command: shown in its --help, taken and read by its command, refused where it cannot apply.

A flag that is silently ignored in some mode is a defect (STYLE: CLI habits). The walk covers the
whole command tree, the lazily loaded `train` subcommands included, so a new option is checked
the moment it is declared: it must be documented, reach the command, and, on `index`, be listed
below as applying to both modes or refused under the other one.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from condsearch.cli import main

#: what `--help` lists on the first line of each option: "-c, --condition TEXT", "--x / --no-x"
_OPTION_LINE = re.compile(r"^  (-[^\s,/]+(?:(?:, | / )-[^\s,/]+)*)")


def _walk(group: click.Group = main, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Return (argv path, command) for the group and every command under it, subcommands of subgroups too."""
    found: list[tuple[tuple[str, ...], click.Command]] = [(path, group)]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found += _walk(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


COMMANDS = _walk()
IDS = [" ".join(path) or "condsearch" for path, _ in COMMANDS]


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def _listed(help_text: str) -> set[str]:
    """Return every option string the Options section of a --help lists."""
    shown: set[str] = set()
    section = help_text.partition("\nOptions:\n")[2]
    for line in section.splitlines():
        if m := _OPTION_LINE.match(line):
            shown.update(m.group(1).replace(" / ", ", ").split(", "))
    return shown


def test_the_walk_reaches_every_command() -> None:
    leaves = {" ".join(path) for path, command in COMMANDS if not isinstance(command, click.Group)}
    assert {"index", "query", "list", "verify", "serve", "export", "demo-corpus"} <= leaves
    assert {"train head", "train lora", "train full", "train router"} <= leaves


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_every_option_is_listed_in_the_help_with_text(path: tuple[str, ...], command: click.Command) -> None:
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    listed = _listed(result.output)
    declared = {name for option in _options(command) for name in (*option.opts, *option.secondary_opts)}
    assert declared - listed == set(), "declared but not in --help"
    assert listed - declared - {"-h", "--help", "--version"} == set(), "in --help but not declared"
    for option in _options(command):
        assert not option.hidden, f"{option.opts}: an option nobody can find"
        assert (option.help or "").strip(), f"{option.opts} has no help"


def _read_names(function: object) -> tuple[set[str], set[str]]:
    """Return the names a function's body reads, and the string keys it subscripts (``params["x"]``)."""
    source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
    defined = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
    names: set[str] = set()
    keys: set[str] = set()
    for statement in defined.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                keys.add(str(node.slice.value))
    return names, keys


#: commands that take their options as **params; each has a test that every option changes the library call
#: or is refused (tests/cli/test_cli_train.py::test_every_option_changes_the_call_or_is_refused;
#: index: test_every_index_option_changes_the_call below; adapt: test_every_adapt_option_changes_its_config)
PARAMS_COMMANDS = {("train", "head"), ("train", "lora"), ("train", "full"), ("train", "router"), ("index",), ("adapt",)}


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_every_parameter_is_taken_and_read_by_its_command(path: tuple[str, ...], command: click.Command) -> None:
    if command.callback is None:
        return
    function = inspect.unwrap(command.callback)
    signature = inspect.signature(function)
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    if takes_all:
        assert path in PARAMS_COMMANDS, f"{path}: **params hides dead options; name them, or test every one"
        return
    names, _ = _read_names(function)
    for param in command.params:
        if not param.expose_value:  # --version: click answers it itself
            continue
        assert param.name in signature.parameters, f"{param.name}: not a parameter of {function.__name__}"
        assert param.name in names, f"{' '.join(path)}: {param.name} is parsed but never read (a dead option)"


# ----------------------------------------------------------------- flags that do not apply are refused

#: index's flags by where they apply; a one-mode flag (or a --ray one) has a refusal in REFUSED below
INDEX_BOTH_MODES = {
    "--condition", "--format", "--text-column", "--id-column", "--name", "--model", "--index-factory",
    "--search-params", "--max-index-memory", "--full", "--batch-size", "--max-length", "--json", "--mode",
    "--threads", "--backend", "--index-dir", "--device", "--trust-remote-code", "--ray", "--store", "--quantize",
    "--keep-columns", "--yes",
}  # fmt: skip
INDEX_CASE_ONLY = {
    "--profile", "--adapter", "--head", "--pooling", "--prompt-template", "--unconditional-template", "--dtype",
    "--bidirectional-layers", "--preset",
}  # fmt: skip
INDEX_CSR_ONLY = {"--router", "--router-layer", "--router-variant"}
INDEX_RAY_ONLY = {"--ray-actors", "--ray-work-dir"}

CSR = ["--mode", "csr"]
CASE = ["--mode", "case"]
#: (command, the flag and its value, the context that makes it not apply, what the usage error says)
REFUSED: list[tuple[str, list[str], list[str], str]] = [
    ("index", ["--profile", "full"], CSR, "apply to --mode case only"),
    ("index", ["--adapter", "{folder}"], CSR, "apply to --mode case only"),
    ("index", ["--head", "lora"], CSR, "apply to --mode case only"),
    ("index", ["--pooling", "mean"], CSR, "apply to --mode case"),
    ("index", ["--prompt-template", "{{condition}}: {{sentence}}"], CSR, "apply to --mode case"),
    ("index", ["--unconditional-template", "{{condition}}"], CSR, "apply to --mode case"),
    ("index", ["--dtype", "float32"], CSR, "apply to --mode case"),
    ("index", ["--bidirectional-layers", "1"], CSR, "apply to --mode case"),
    ("index", ["--preset", "bellm"], CSR, "apply to --mode case"),
    ("index", ["--router", "none"], CASE, "apply to --mode csr"),
    ("index", ["--router-layer", "2"], CASE, "apply to --mode csr"),
    ("index", ["--router-variant", "context"], CASE, "apply to --mode csr"),
    ("index", ["--ray-actors", "2"], [], "--ray-actors applies with --ray"),
    ("index", ["--ray-work-dir", "{folder}"], CSR, "--ray-work-dir applies with --ray"),
    ("query", ["--store", "milvus://localhost:1"], ["--index-dir", "{folder}"], "give one"),
    ("serve", ["--store", "milvus://localhost:1"], ["--index-dir", "{folder}"], "give one"),
    ("verify", ["--corpus", "c"], [], "--corpus picks among the indexes of a --condition"),
    ("export", ["--corpus", "c"], ["--to", "milvus://localhost:1"], "--corpus picks among the indexes"),
]


def test_every_index_flag_is_classified_and_each_one_mode_flag_is_refused_in_the_other() -> None:
    index = main.commands["index"]
    flags = {option.opts[-1] for option in _options(index)}
    classified = INDEX_BOTH_MODES | INDEX_CASE_ONLY | INDEX_CSR_ONLY | INDEX_RAY_ONLY
    assert flags == classified, f"classify index's new flags: {sorted(flags ^ classified)}"
    refused = {(flag[0], tuple(context)) for command, flag, context, _ in REFUSED if command == "index"}
    for flag in INDEX_CASE_ONLY:
        assert (flag, tuple(CSR)) in refused, f"{flag} under --mode csr"
    for flag in INDEX_CSR_ONLY:
        assert (flag, tuple(CASE)) in refused or (flag, ()) in refused, f"{flag} under --mode case"
    for flag in INDEX_RAY_ONLY:
        assert any(f == flag and "--ray" not in context for f, context in refused), f"{flag} without --ray"


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize(
    ("command", "flag", "context", "message"), REFUSED, ids=[f"{c} {f[0]} {' '.join(x)}" for c, f, x, _ in REFUSED]
)
def test_a_flag_that_does_not_apply_is_a_usage_error_before_any_work(
    command: str,
    flag: list[str],
    context: list[str],
    message: str,
    corpus_file: Path,
    tiny_bert_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr("condsearch.model.encoders.load_encoder", no_model)
    (tmp_path / "folder").mkdir()
    fill = {"folder": str(tmp_path / "folder")}
    flag = [v.format(**fill) for v in flag]
    context = [v.format(**fill) for v in context]
    where = ["--index-dir", str(tmp_path / "idx")] if command in ("index", "verify") else []
    if command == "index":
        args = ["index", str(corpus_file), "-c", "colour", "--model", str(tiny_bert_dir), *where, *context, *flag]
    elif command == "query":
        args = ["query", "a red dress", "-c", "colour", *context, *flag]
    else:
        args = [command, *where, *context, *flag]
    result = _invoke(args)
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert not (tmp_path / "idx").exists()


def test_a_flag_that_applies_is_not_refused(corpus_file: Path, tiny_bert_dir: Path, tmp_path: Path) -> None:
    # the other side of the table: the same flags in their own mode index and answer
    base = ["index", str(corpus_file), "-c", "colour", "--model", str(tiny_bert_dir), "--head", "none"]
    case = _invoke([*base, "--pooling", "mean", "--index-dir", str(tmp_path / "case")])
    assert case.exit_code == 0, case.output
    csr = _invoke([*base[:-2], "--mode", "csr", "--router", "none", "--index-dir", str(tmp_path / "csr")])
    assert csr.exit_code == 0, csr.output


def test_query_profile_and_its_older_spelling_head_are_one_option(tmp_path: Path) -> None:
    [option] = [o for o in _options(main.commands["query"]) if "--profile" in o.opts]
    assert option.name == "profile" and option.opts == ["--profile", "--head"]


# ----------------------------------------------------------------- index: every option changes the call

#: a value off the default for each of index's options (flags take none; --ray alone is a local instance)
INDEX_VALUES: dict[str, list[str]] = {
    "--condition": ["another condition"],
    "--format": ["csv"],
    "--text-column": ["body"],
    "--id-column": ["key"],
    "--name": ["other"],
    "--model": ["some/model"],
    "--profile": ["lora"],
    "--adapter": ["{folder}"],
    "--head": ["none"],
    "--index-factory": ["HNSW32"],
    "--search-params": ["efSearch=16"],
    "--max-index-memory": ["1G"],
    "--batch-size": ["9"],
    "--max-length": ["64"],
    "--mode": ["case"],  # auto is csr for the default model
    "--router": ["none"],
    "--router-layer": ["2"],
    "--router-variant": ["context"],
    "--pooling": ["mean"],
    "--prompt-template": ["{{condition}}: {{sentence}}"],
    "--unconditional-template": ["{{condition}}:"],
    "--dtype": ["float32"],
    "--bidirectional-layers": ["1"],
    "--preset": ["bellm"],
    "--quantize": ["int8"],
    "--keep-columns": ["lang"],
    "--backend": ["torch"],
    "--threads": ["1"],
    "--index-dir": ["{folder}/indexes"],
    "--device": ["cpu"],
    "--ray": [],
    "--ray-actors": ["2"],
    "--ray-work-dir": ["{folder}/work"],
    "--store": ["milvus://localhost:1"],
}
#: what a flag needs beside it to apply (compared with a run of that companion alone)
INDEX_NEEDS = {flag: CSR for flag in INDEX_CSR_ONLY} | {flag: ["--ray"] for flag in INDEX_RAY_ONLY}
INDEX_NEEDS["--search-params"] = ["--index-factory", "HNSW32"]


@pytest.fixture
def index_calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Any, ...]]:
    """Replace every library call of index by one that records its arguments (the spec's runtime included)."""
    calls: list[tuple[Any, ...]] = []

    def reports(conditions: tuple[str, ...]) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=f"index-{c}", n_encoded=2, n_reused=0, n_resumed=0) for c in conditions]

    class Corpus(list[str]):
        n_skipped = 0

    def scan_corpus(*args: object, **kwargs: object) -> Corpus:
        calls.append(("scan", args, kwargs))
        return Corpus(["a red dress", "a blue hat"])

    manifest = SimpleNamespace(
        condition="c",
        n_vectors=2,
        dim=4,
        model_id="m",
        mode="case",
        head="h",
        factory="Flat",
        search_params="",
        spec={},
        precision="float32",
    )
    store = SimpleNamespace(root=tmp_path, read_manifest=lambda name: manifest, manifests=lambda: [])

    def open_store(index_dir: Path | None) -> SimpleNamespace:
        calls.append(("store", index_dir))
        return store

    def load_bulk_vectorizer(spec: Any, *, backend: str) -> SimpleNamespace:
        calls.append(("load", spec, spec.runtime, backend))
        return SimpleNamespace(backend="torch", encoder=None)

    def index_conditions(data: object, conditions: tuple[str, ...], *args: object, **build: object) -> list[Any]:
        calls.append(("index", conditions, args, build))
        return reports(conditions)

    def ray_index_conditions(data: object, conditions: tuple[str, ...], spec: Any, *args: object, **kw: Any) -> Any:
        calls.append(("ray", conditions, spec, spec.runtime, kw))
        return SimpleNamespace(reports=reports(conditions), runner="torch")

    def export_indexes(store: object, names: list[str], store_spec: str) -> list[Any]:
        calls.append(("export", names, store_spec))
        return []

    monkeypatch.setattr("condsearch.corpus.reader.scan_corpus", scan_corpus)
    monkeypatch.setattr("condsearch.cli.index.open_store", open_store)
    monkeypatch.setattr("condsearch.model.policy.load_bulk_vectorizer", load_bulk_vectorizer)
    monkeypatch.setattr("condsearch.ingest.chunks.index_conditions", index_conditions)
    monkeypatch.setattr("condsearch.scale.ray_encode.ray_index_conditions", ray_index_conditions)
    monkeypatch.setattr("condsearch.scale.export.export_indexes", export_indexes)
    return calls


def test_every_index_option_changes_the_call(
    index_calls: list[tuple[Any, ...]], corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # index takes its options as **params: each one must reach a library call (or what it prints)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    fill = {"folder": str(tmp_path / "folder")}
    base = ["index", str(corpus_file), "-c", "colour"]

    def call(*args: str) -> tuple[list[tuple[Any, ...]], str]:
        index_calls.clear()
        result = _invoke([*base, *args])
        assert result.exit_code == 0, (args, result.output)
        return list(index_calls), result.stdout

    reference = call()
    assert [c[0] for c in reference[0]] == ["store", "scan", "load", "index"]  # the store first: auto keeps its mode
    for option in _options(main.commands["index"]):
        if option.name == "help":
            continue
        flag = option.opts[-1]
        given = [] if option.is_flag else [v.format(**fill) for v in INDEX_VALUES[flag]]
        needs = INDEX_NEEDS.get(flag, [])
        reference_now = call(*needs) if needs else reference
        assert call(*needs, flag, *given) != reference_now, f"index {flag} changed nothing"


# ----------------------------------------------------------------- float options are finite


def _float_options(command: click.Command) -> list[click.Option]:
    return [o for o in _options(command) if isinstance(o.type, click.types.FloatParamType)]


def test_the_walk_finds_float_options() -> None:
    names = {o.name for _, command in COMMANDS for o in _float_options(command)}
    assert {"lr", "anchor_weight", "margin", "blend", "batch_window_ms"} <= names


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
@pytest.mark.parametrize("value", ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400"])
def test_every_float_option_refuses_non_finite_values(
    path: tuple[str, ...], command: click.Command, value: str
) -> None:
    """issue 37 (7): FloatRange takes nan (every comparison with it is false), so each float option checks."""
    ctx = click.Context(command)
    for option in _float_options(command):
        with pytest.raises(click.BadParameter, match="not a finite number"):
            option.type.convert(value, option, ctx)


def test_a_non_finite_float_is_a_one_line_usage_error() -> None:
    from tests.cli.test_cli import assert_clean_error

    result = CliRunner().invoke(main, ["train", "full", "t.csv", "--out", "o", "--anchor-weight", "nan"])
    message = assert_clean_error(result, code=2)
    assert "--anchor-weight" in message and "'nan' is not a finite number" in message


def test_finite_float_keeps_ranges_and_their_help() -> None:
    from condsearch.cli.options import FINITE_FLOAT, FiniteFloatRange

    assert FINITE_FLOAT.convert("-2.5", None, None) == -2.5
    unit = FiniteFloatRange(0, 1, min_open=True)
    assert unit.convert("1", None, None) == 1.0
    with pytest.raises(click.BadParameter, match="0<x<=1"):
        unit.convert("0", None, None)
    assert unit._describe_range() == "0<x<=1"  # what --help shows, as click.FloatRange's


#: a value unlike AdaptConfig's default for each option adapt takes as **params
ADAPT_VALUES = {
    "--holdout": "0.3",
    "--validation": "0.2",
    "--n-pairs": "300",
    "--epochs": "3",
    "--lr": "0.001",
    "--train-batch-size": "16",
    "--contrast-weight": "0.5",
    "--distill-weight": "0",
    "--replay-weight": "0.5",
    "--anchor": "none",
    "--wise-keep": "0.8",
    "--train-backbone": "all",
    "--report-rows": "50",
    "--queries": "7",
    "--seed": "3",
}


def test_every_adapt_option_changes_its_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from condsearch.train import adapt as adapt_module

    seen: list[object] = []

    def fake_adapt(table: Path, labels: object, out: Path, config: object, **kwargs: object) -> dict[str, int]:
        seen.append(config)
        return {"ok": 1}

    monkeypatch.setattr(adapt_module, "adapt_router", fake_adapt)
    table = tmp_path / "t.csv"
    table.write_text("id,text,kind\n" + "".join(f"{i},text number {i},{'ab'[i % 2]}\n" for i in range(40)))
    base = ["adapt", str(table), "--label", "kind=the kind", "--out", str(tmp_path / "out"), "--json"]
    command = main.commands["adapt"]
    named = set(inspect.signature(inspect.unwrap(command.callback)).parameters)  # type: ignore[arg-type]
    fields = {f.name for f in dataclasses.fields(adapt_module.AdaptConfig)}
    result = CliRunner().invoke(main, base)
    assert result.exit_code == 0, result.output
    reference = seen[-1]
    for option in command.params:
        if not isinstance(option, click.Option) or option.name in named or option.name == "help":
            continue
        assert option.name in fields, f"adapt {option.opts[-1]}: not a field of AdaptConfig (a dead option)"
        flag = option.opts[-1]
        if option.is_flag and option.default and option.secondary_opts:
            flag = option.secondary_opts[0]  # the spelling that is not the default (--contrast-only)
        given = [flag] if option.is_flag else [flag, ADAPT_VALUES[flag]]
        result = CliRunner().invoke(main, [*base, *given])
        assert result.exit_code == 0, (flag, result.output)
        assert seen[-1] != reference, f"adapt {flag} changed nothing"
