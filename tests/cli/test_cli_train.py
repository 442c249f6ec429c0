"""`condsearch train head|lora|full|router`: every flag applies, defaults come from the configs, old spelling maps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from condsearch.cli import main
from condsearch.cli.train import SUBCOMMANDS, TrainGroup, legacy_subcommand
from condsearch.model.csr.router import RouterConfig
from condsearch.train.finetune import DEFAULT_LR, FinetuneConfig
from condsearch.train.head import HeadTrainConfig
from condsearch.train.lora import LoraConfig
from condsearch.train.router import RouterTrainConfig

CSV = "sentence1,sentence2,condition,label\na red dress,a blue dress,colour,2\na red hat,a red coat,colour,5\n"


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _command(name: str) -> click.Command:
    group = main.commands["train"]
    assert isinstance(group, TrainGroup)
    command = group.get_command(click.Context(group), name)
    assert command is not None
    return command


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_each_subcommand_has_its_listed_help_and_every_option_has_help(name: str) -> None:
    command = _command(name)
    assert command.help is not None and command.help.strip().splitlines()[0] == SUBCOMMANDS[name][1]
    assert [p.name for p in command.params if isinstance(p, click.Option) and not p.help] == []
    assert run("train", name, "--help").exit_code == 0


def test_train_help_loads_no_model_library() -> None:
    code = "from condsearch.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
    code += "import sys; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def _shown_default(name: str, flag: str) -> str:
    [option] = [p for p in _command(name).params if isinstance(p, click.Option) and flag in p.opts]
    return str(option.default)


@pytest.mark.parametrize(
    ("name", "flag", "value"),
    [
        ("head", "--epochs", HeadTrainConfig.epochs),
        ("head", "--lr", HeadTrainConfig.lr),
        ("head", "--train-batch-size", HeadTrainConfig.batch_size),
        ("head", "--dim", HeadTrainConfig.dim),
        ("router", "--lr", RouterTrainConfig.lr),
        ("router", "--epochs", RouterTrainConfig.epochs),
        ("router", "--train-batch-size", RouterTrainConfig.batch_size),
        ("router", "--router-layer", RouterConfig.layer),
        ("lora", "--lr", DEFAULT_LR["lora"]),
        ("full", "--lr", DEFAULT_LR["full"]),
        ("lora", "--epochs", FinetuneConfig.epochs),
        ("lora", "--lora-rank", LoraConfig.rank),
        ("full", "--layer-decay", FinetuneConfig.layer_decay),
        ("full", "--anchor-weight", FinetuneConfig.anchor_weight),
        ("full", "--blend", FinetuneConfig.blend),
    ],
)
def test_defaults_come_from_the_configs(name: str, flag: str, value: object) -> None:
    assert _shown_default(name, flag) == str(value)


# ----------------------------------------------------------------- every flag applies

#: a value differing from the default for each option (flags take none); the head and the adapter need
#: --head-on-top, a margin its loss; what a BERT-style model refuses is listed in REFUSED
VALUES: dict[str, list[str]] = {
    "--dev": ["{csv}"],
    "--epochs": ["7"],
    "--lr": ["0.123"],
    "--train-batch-size": ["6"],
    "--seed": ["5"],
    "--model": ["{model}"],
    "--max-length": ["64"],
    "--device": ["cpu"],
    "--dim": ["7"],
    "--dropout": ["0.3"],
    "--batch-size": ["9"],
    "--pooling": ["condition-mean"],
    "--prompt-template": ["{{condition}}: {{sentence}}"],
    "--unconditional-template": ["{{condition}}:"],
    "--dtype": ["float16"],
    "--bidirectional-layers": ["1"],
    "--preset": ["bellm"],
    "--loss": ["mse+wacl"],
    "--quad-margin": ["0.5", "--loss", "quad"],
    "--bcl-temperature": ["3", "--loss", "mse+bcl"],
    "--bcl-sigma": ["0.7", "--loss", "mse+bcl"],
    "--layer-decay": ["0.5"],
    "--anchor-weight": ["0.5"],
    "--blend": ["0.5"],
    "--head-lr": ["0.01"],
    "--init-head": ["{head}"],
    "--checkpoint-dir": ["{tmp}/ckpt"],
    "--checkpoint-every": ["2"],
    "--lora-rank": ["4"],
    "--lora-alpha": ["8"],
    "--lora-dropout": ["0.2"],
    "--lora-targets": ["query,value"],
    "--router-variant": ["extended"],
    "--router-layer": ["0"],
}
ROUTER_VALUES = {
    "--loss": ["wacl"],
    "--contrast-weight": ["0.5"],
    "--k": ["3"],
    "--train-backbone": ["top"],
    "--init": ["full"],
}
#: the router's flags that apply with the context variant only
ROUTER_NEEDS = {flag: ["--router-variant", "context"] for flag in ("--k", "--init")}
NEEDS = {"--dim": ["--head-on-top"], "--dropout": ["--head-on-top"], "--head-lr": ["--head-on-top"]}
NEEDS |= {"--init-head": ["--head-on-top"], "--batch-size": ["--dev", "{csv}"]}
REFUSED = {("lora", f) for f in ("--prompt-template", "--unconditional-template", "--bidirectional-layers", "--preset")}
TARGETS = {
    "head": "condsearch.train.head.fit_and_save_head",
    "lora": "condsearch.train.finetune_save.fit_and_save_encoder",
    "full": "condsearch.train.finetune_save.fit_and_save_encoder",
    "router": "condsearch.train.router.fit_and_save_router",
}


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace each subcommand's library call by one that records its arguments."""
    calls: list[dict[str, Any]] = []

    def fake(*args: object, **kwargs: object) -> dict[str, object]:
        calls.append({"args": args, **{k: v for k, v in kwargs.items() if k != "on_epoch"}})
        return {"dim": 4, "variant": "paper", "layer": 1, "best_epoch": 1}

    for target in set(TARGETS.values()):
        module, _, attr = target.rpartition(".")
        monkeypatch.setattr(f"{module}.{attr}", fake)
    return calls


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_option_changes_the_call_or_is_refused(
    name: str, captured: list[dict[str, Any]], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    (tmp_path / "start").mkdir()
    fmt = {"csv": str(csv), "model": str(tiny_bert_dir), "head": str(tmp_path / "start"), "tmp": str(tmp_path)}
    base = ["train", name, fmt["csv"], "--out", str(tmp_path / "out")]
    baseline = run(*base)
    assert baseline.exit_code == 0, baseline.output
    reference = (captured[-1], baseline.stdout)
    values = {**VALUES, **(ROUTER_VALUES if name == "router" else {})}
    for option in _command(name).params:
        if not isinstance(option, click.Option) or option.name in ("help",) or "--out" in option.opts:
            continue
        flag = option.opts[-1]
        given = [] if option.is_flag else [v.format(**fmt) for v in values[flag]]
        needs = NEEDS if name in ("lora", "full") else ROUTER_NEEDS if name == "router" else {}
        extra = [v.format(**fmt) for v in needs.get(flag, [])]
        args = [*base, *extra, flag, *given]
        if extra:  # the flag's companion alone must not be the change
            companion = run(*base, *extra)
            assert companion.exit_code == 0, companion.output
            reference_now = (captured[-1], companion.stdout)
        else:
            reference_now = reference
        result = run(*args)
        if (name, flag) in REFUSED:
            assert result.exit_code == 2, (flag, result.output)
            continue
        assert result.exit_code == 0, (flag, result.output)
        assert (captured[-1], result.stdout) != reference_now, f"train {name} {flag} changed nothing"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["head", "--loss", "quad"], "No such option"),
        (["head", "--finetune", "lora"], "No such option"),
        (["router", "--dim", "4"], "No such option"),
        (["router", "--batch-size", "8"], "No such option"),
        (["router", "--pooling", "mean"], "No such option"),
        (["full", "--lora-rank", "2"], "No such option"),
        (["full", "--prompt-template", "x"], "No such option"),
        (["lora", "--dtype", "float16"], "No such option"),
        (["lora", "--dim", "4"], "apply with --head-on-top"),
        (["full", "--init-head", "frozen"], "apply with --head-on-top"),
        (["lora", "--batch-size", "8"], "applies with --dev"),
        (["lora", "--quad-margin", "2"], "applies with --loss quad"),
        (["full", "--bcl-sigma", "0.2", "--loss", "mse+quad"], "applies with --loss bcl"),
        (["lora", "--loss", "mse=x"], "--loss"),
        (["lora", "--lora-targets", "nope"], "targets"),
        (["lora", "--pooling", "mean"], "condition-mean"),
        (["lora", "--preset", "bellm"], "decoder embedders"),
        (["lora", "--head-on-top", "--init-head", "no/such/head"], "--init-head"),
        (["router", "--loss", "quad"], "'quad' is not one of"),
        (["router", "--k", "2"], "apply with --variant context"),
        (["router", "--variant", "context", "--router-layer", "-2"], "--router-layer applies"),
    ],
)
def test_flags_that_do_not_apply_are_refused(
    args: list[str], match: str, captured: list[dict[str, Any]], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    name, *rest = args
    result = run("train", name, csv, "--out", tmp_path / "x", "--model", tiny_bert_dir, *rest)
    assert result.exit_code == 2 and match in result.output, result.output
    assert captured == []


# ----------------------------------------------------------------- the old spelling


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["t.csv", "--out", "h"], ("head", ["t.csv", "--out", "h"])),
        (["t.csv", "--finetune", "lora", "--out", "a"], ("lora", ["t.csv", "--out", "a"])),
        (["--finetune=full", "t.csv", "--mode", "case"], ("full", ["t.csv"])),
        (["t.csv", "--mode", "csr", "--finetune", "none"], ("router", ["t.csv"])),
    ],
)
def test_legacy_spelling_maps_to_a_subcommand(args: list[str], expected: tuple[str, list[str]]) -> None:
    assert legacy_subcommand(args) == expected


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--finetune", "lora", "--mode", "csr"], "--mode case"),
        (["--finetune", "qlora"], "--finetune"),
        (["--mode", "x"], "--mode"),
    ],
)
def test_legacy_spelling_refuses_what_it_cannot_map(args: list[str], match: str) -> None:
    with pytest.raises(click.UsageError, match=match):
        legacy_subcommand(["t.csv", *args])


def test_legacy_spelling_runs_the_subcommand_with_a_note(
    captured: list[dict[str, Any]], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    result = run("train", csv, "--out", tmp_path / "r", "--mode", "csr", "--epochs", 2, "--model", tiny_bert_dir)
    assert result.exit_code == 0, result.output
    assert "deprecated" in result.stderr and "condsearch train router" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert captured[-1]["args"][2] == RouterTrainConfig(epochs=2)


# ----------------------------------------------------------------- the documented examples


def _train_examples() -> list[tuple[str, str]]:
    """Return every `condsearch train …` command in README.md, docs/ and benchmarks/ READMEs (continuations joined)."""
    root = Path(__file__).resolve().parents[2]
    found = []
    pages = sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))
    benches = sorted(str(p.relative_to(root)) for p in (root / "benchmarks").glob("**/README.md"))
    for doc in ("README.md", *pages, *benches):
        text = (root / doc).read_text(encoding="utf-8").replace("\\\n", " ")
        found += [(doc, line.strip()) for line in text.splitlines() if line.strip().startswith("condsearch train ")]
    return found


@pytest.mark.parametrize(("doc", "line"), _train_examples())
def test_documented_train_commands_parse(
    doc: str, line: str, captured: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    for name in ("train.csv", "dev.csv"):
        (tmp_path / name).write_text(CSV)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(
        line.replace("$D", str(tmp_path)).replace("../shared/data/csts-reannotated", str(tmp_path)), comments=True
    )
    for flag in ("--out", "--checkpoint-dir"):  # write nowhere near the shipped assets
        if flag in args:
            args[args.index(flag) + 1] = str(tmp_path / flag.strip("-"))
    result = CliRunner().invoke(main, args[1:])
    assert result.exit_code == 0, (doc, line, result.output)
    assert "deprecated" not in result.stderr and len(captured) == 1
