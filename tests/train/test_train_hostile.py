"""Hostile inputs to training: foreign --out folders are never replaced, bad labels and weights never saved."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import Result

from tests.cli.test_cli import assert_clean_error, ok, run

ROWS = [
    ("a girl in a red dress", "a woman in a red dress", "the colour", 5),
    ("a girl in a red dress", "a woman in a red dress", "the sport", 2),
    ("two men play soccer", "a boy plays soccer", "the sport", 5),
    ("two men play soccer", "a boy plays soccer", "the colour", 1),
    ("a man in a green hat", "a boy in a green shirt", "the colour", 4),
    ("a man in a green hat", "a boy in a green shirt", "the sport", 1),
]
#: subcommand -> the artifact kind it writes, and the flags that make it quick on the tiny BERT
KINDS = {"head": "head", "lora": "adapter", "full": "model", "router": "router"}
QUICK = {
    "head": ("--dim", 4, "--epochs", 1),
    "lora": ("--lora-rank", 2, "--epochs", 1),
    "full": ("--epochs", 1),
    "router": ("--epochs", 1),
}


def _csv(path: Path, rows: Sequence[tuple[str, str, str, object]] = ROWS) -> Path:
    path.write_text("sentence1,sentence2,condition,label\n" + "".join(f"{a},{b},{c},{y}\n" for a, b, c, y in rows))
    return path


def _train(name: str, csv: Path, out: Path, model: Path, *extra: object) -> Result:
    return run("train", name, csv, "--out", out, "--model", model, *QUICK[name], *extra)


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below folder, by relative path, and the names beside it (no temporaries left behind)."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    files["<beside>"] = "\n".join(sorted(os.listdir(folder.parent))).encode()
    return files


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path) -> dict[str, Path]:
    """One artifact of each kind, as `condsearch train` writes it on the tiny BERT."""
    root = tmp_path_factory.mktemp("genuine")
    csv = _csv(root / "t.csv")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONDSEARCH_CACHE_DIR", str(root / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        for name in KINDS:
            ok(_train(name, csv, root / name, tiny_bert_dir))
    return {name: root / name for name in KINDS}


def _copy(genuine: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(genuine[name], tmp_path / "out"))


def _hub_peft_adapter(folder: Path) -> Path:
    """A PEFT adapter as downloaded from the hub: PEFT's two files and a README, no condsearch sidecar."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"peft_type":"LORA"}')
    (folder / "adapter_model.safetensors").write_bytes(b"weights from the hub")
    (folder / "README.md").write_text("# my adapter\n")
    return folder


def _empty_head_marker(folder: Path) -> Path:
    """A folder that merely holds a file named like a head's marker, beside someone's files."""
    folder.mkdir(parents=True)
    (folder / "head.json").write_text("{}")
    (folder / "notes.txt").write_text("keep me")
    (folder / "data.csv").write_text("a,b\n1,2\n")
    return folder


# ----------------------------------------------------------------- defect 1: only our own --out is replaced


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("make", [_hub_peft_adapter, _empty_head_marker], ids=["hub-peft-adapter", "empty-head-json"])
def test_train_refuses_a_folder_that_only_holds_a_marker_name(
    name: str, make: object, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = _csv(tmp_path / "t.csv")
    folder = make(tmp_path / "mine")  # type: ignore[operator]
    before = _snapshot(folder)
    message = assert_clean_error(_train(name, csv, folder, tiny_bert_dir))
    assert str(folder) in message and "refusing" in message and "not a condsearch artifact" in message
    assert _snapshot(folder) == before


@pytest.mark.parametrize("name", list(KINDS))
def test_train_refuses_its_own_kind_beside_foreign_files(
    name: str, genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = _csv(tmp_path / "t.csv")
    out = _copy(genuine, name, tmp_path)
    (out / "README.md").write_text("my notes on this run\n")
    before = _snapshot(out)
    message = assert_clean_error(_train(name, csv, out, tiny_bert_dir))
    assert "README.md" in message and "refusing" in message
    assert _snapshot(out) == before


@pytest.mark.parametrize("name", list(KINDS))
def test_train_replaces_its_own_earlier_output(
    name: str, genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    from condsearch.base.artifact_files import artifact_kind

    out = _copy(genuine, name, tmp_path)
    before = _snapshot(out)
    ok(_train(name, _csv(tmp_path / "t.csv"), out, tiny_bert_dir, "--seed", 7))
    assert artifact_kind(out) == KINDS[name] and _snapshot(out) != before
    assert sorted(os.listdir(tmp_path)) == ["out", "t.csv"]


@pytest.mark.parametrize(
    ("have", "name"), [("head", "lora"), ("lora", "head"), ("router", "head"), ("full", "router"), ("head", "router")]
)
def test_train_refuses_an_output_of_another_kind(
    have: str, name: str, genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = _csv(tmp_path / "t.csv")
    out = _copy(genuine, have, tmp_path)
    before = _snapshot(out)
    message = assert_clean_error(_train(name, csv, out, tiny_bert_dir))
    article = "an" if KINDS[name][0] in "aeiou" else "a"
    assert f"holds a condsearch {KINDS[have]}, not {article} {KINDS[name]}" in message
    assert _snapshot(out) == before


def test_train_refuses_a_foreign_checkpoint_folder(tiny_bert_dir: Path, tmp_path: Path) -> None:
    csv = _csv(tmp_path / "t.csv")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "checkpoint.json").write_text('{"epoch": 3}')
    (folder / "results.txt").write_text("keep me")
    before = _snapshot(folder)
    result = _train("lora", csv, tmp_path / "lora", tiny_bert_dir, "--checkpoint-dir", folder)
    assert "not a condsearch artifact" in assert_clean_error(result)
    assert _snapshot(folder) == before and not (tmp_path / "lora").exists()


def test_converting_in_place_keeps_a_folder_with_foreign_files(genuine: dict[str, Path], tmp_path: Path) -> None:
    from condsearch.base.artifact_files import ArtifactFolderError
    from condsearch.model.artifacts.convert import convert_legacy_adapter
    from tests.model.artifacts.test_artifacts import _legacy

    old = _legacy(genuine["lora"], tmp_path / "old")
    (old / "README.md").write_text("how I trained it\n")
    before = _snapshot(old)
    with pytest.raises(ArtifactFolderError, match=r"\(README\.md\)"):
        convert_legacy_adapter(old)
    assert _snapshot(old) == before


def test_a_two_tower_router_keeps_its_tail_folder_and_nothing_else(genuine: dict[str, Path], tmp_path: Path) -> None:
    from condsearch.base.artifact_files import ROUTER_TAIL, ArtifactFolderError, check_own_artifact

    out = _copy(genuine, "router", tmp_path)
    shutil.copytree(genuine["router"], out / ROUTER_TAIL)  # benchmarks/paper/kgc.py's candidate tower
    check_own_artifact(out, "router")
    (out / ROUTER_TAIL / "notes.txt").write_text("keep me")
    with pytest.raises(
        ArtifactFolderError, match=r"tail: holds what a condsearch router does not write \(notes\.txt\)"
    ):
        check_own_artifact(out, "router")
    (out / "runs").mkdir()
    with pytest.raises(ArtifactFolderError, match=r"\(runs\)"):
        check_own_artifact(out, "router")


def test_the_writers_refuse_a_foreign_folder_too(tmp_path: Path) -> None:
    """The check is in the library, not only the CLI: save_head and save_router refuse a hub adapter."""
    from condsearch.errors import CondsearchError
    from condsearch.model.head import HeadConfig, ProjectionHead, save_head

    folder = _hub_peft_adapter(tmp_path / "hub")
    before = _snapshot(folder)
    with pytest.raises(CondsearchError, match="not a condsearch artifact"):
        save_head(ProjectionHead(HeadConfig(input_dim=3, dim=2)), folder)
    assert _snapshot(folder) == before


# ----------------------------------------------------------------- defect 8: labels off the scale


@pytest.mark.parametrize("label", ["nan", "NaN", "inf", "-inf", "0", "6", "1e9", "5.0001"])
@pytest.mark.parametrize("name", ["head", "lora", "router"])
def test_train_refuses_labels_off_the_scale(name: str, label: str, tiny_bert_dir: Path, tmp_path: Path) -> None:
    rows = [*ROWS[:2], (ROWS[2][0], ROWS[2][1], ROWS[2][2], label), *ROWS[3:]]
    csv = _csv(tmp_path / "t.csv", rows)
    message = assert_clean_error(_train(name, csv, tmp_path / "out", tiny_bert_dir))
    assert f"{csv}:4: label {label!r}" in message and "1-5" in message
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]


def test_bad_dev_labels_leave_an_earlier_head_unchanged(
    genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = _csv(tmp_path / "t.csv")
    dev = _csv(tmp_path / "dev.csv", [*ROWS[:1], (ROWS[1][0], ROWS[1][1], ROWS[1][2], "inf")])
    out = _copy(genuine, "head", tmp_path)
    before = _snapshot(out)
    message = assert_clean_error(_train("head", csv, out, tiny_bert_dir, "--dev", dev))
    assert f"{dev}:3:" in message
    assert _snapshot(out) == before


def test_read_csts_keeps_the_scale_and_drops_invalid_rows(tmp_path: Path) -> None:
    from condsearch.corpus.csts import read_csts
    from condsearch.errors import CorpusError

    data = read_csts(_csv(tmp_path / "ok.csv", [*ROWS, ("x", "y", "the colour", -1), ("x", "y", "c", "1.5")]))
    assert data.n_dropped == 1 and data.labels.min() == 1 and data.labels.max() == 5 and len(data) == len(ROWS) + 1
    # a quoted field across lines: the error names the line the row ends on, as an editor shows it
    path = tmp_path / "multi.csv"
    path.write_text('sentence1,sentence2,condition,label\n"two\nlines",b,c,3\na,b,c,nan\n')
    with pytest.raises(CorpusError, match=r"multi\.csv:4: label 'nan'"):
        read_csts(path)


# ----------------------------------------------------------------- defect 8: non-finite weights


def _nan_head(input_dim: int = 3, dim: int = 2):  # -> ProjectionHead
    from condsearch.model.head import HeadConfig, ProjectionHead

    head = ProjectionHead(HeadConfig(input_dim=input_dim, dim=dim))
    with torch.no_grad():
        head.linear.weight[0, 0] = math.nan
    return head


def test_a_diverged_head_is_not_saved_and_the_previous_one_stays(
    genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.train.head

    real = condsearch.train.head.fit_head

    def diverge(*args: object, **kwargs: object) -> object:
        head, history = real(*args, **kwargs)  # type: ignore[arg-type]
        with torch.no_grad():
            head.linear.weight.fill_(math.inf)
        return head, history

    monkeypatch.setattr(condsearch.train.head, "fit_head", diverge)
    csv = _csv(tmp_path / "t.csv")
    out = _copy(genuine, "head", tmp_path)
    before = _snapshot(out)
    message = assert_clean_error(_train("head", csv, out, tiny_bert_dir))
    assert "NaN or inf" in message and str(out) in message
    assert _snapshot(out) == before


def test_save_head_refuses_non_finite_weights(tmp_path: Path) -> None:
    from condsearch.errors import ModelError
    from condsearch.model.head import HeadConfig, ProjectionHead, save_head

    out = tmp_path / "head"
    save_head(ProjectionHead(HeadConfig(input_dim=3, dim=2)), out)
    before = _snapshot(out)
    with pytest.raises(ModelError, match="NaN or inf"):
        save_head(_nan_head(), out)
    assert _snapshot(out) == before


def test_save_router_refuses_non_finite_weights(genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path) -> None:
    from condsearch.base.model_sources import resolve_model
    from condsearch.errors import ModelError
    from condsearch.model.csr.encoder import CsrEncoder
    from condsearch.model.csr.weights import save_router

    out = _copy(genuine, "router", tmp_path)
    before = _snapshot(out)
    encoder = CsrEncoder(resolve_model(str(tiny_bert_dir)), device="cpu", router=str(out))
    with torch.no_grad():
        next(iter(encoder.router.trainable_parameters().values())).fill_(math.nan)
    with pytest.raises(ModelError, match="NaN or inf"):
        save_router(encoder.router, out, {})
    assert _snapshot(out) == before


def test_save_adapter_refuses_non_finite_weights(genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path) -> None:
    from condsearch.errors import ModelError
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.train.adapter import save_adapter
    from condsearch.train.lora import LoraConfig, add_lora, lora_state

    out = _copy(genuine, "lora", tmp_path)
    before = _snapshot(out)
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), dtype="float32", runtime=Runtime(device="cpu")))
    config = LoraConfig(rank=2)
    add_lora(encoder.model, config)  # type: ignore[attr-defined]
    with torch.no_grad():
        next(iter(lora_state(encoder.model).values())).fill_(math.nan)  # type: ignore[attr-defined]
    with pytest.raises(ModelError, match="NaN or inf"):
        save_adapter(encoder, config, out)  # type: ignore[arg-type]
    assert _snapshot(out) == before


def test_save_full_model_refuses_non_finite_weights(
    genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    from condsearch.errors import ModelError
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.train.finetune import FinetuneResult
    from condsearch.train.finetune_save import _save_full

    out = _copy(genuine, "full", tmp_path)
    before = _snapshot(out)
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), dtype="float32", runtime=Runtime(device="cpu")))
    with torch.no_grad():
        next(encoder.model.parameters()).fill_(math.inf)  # type: ignore[attr-defined]
    with pytest.raises(ModelError, match="model weights.*NaN or inf"):
        _save_full(encoder, FinetuneResult(None, [], 1), out, {"training": {}})  # type: ignore[arg-type]
    assert _snapshot(out) == before


def test_save_checkpoint_refuses_non_finite_weights(tmp_path: Path) -> None:
    from condsearch.errors import ModelError
    from condsearch.train.checkpoint import TrainingState, save_checkpoint

    weight = torch.nn.Parameter(torch.ones(2, 2))
    params = {"w": weight}
    optimizer = torch.optim.AdamW([weight])
    out = tmp_path / "ckpt"
    save_checkpoint(out, TrainingState(config={}), params, optimizer, None)
    before = _snapshot(out)
    with torch.no_grad():
        weight.fill_(math.nan)
    with pytest.raises(ModelError, match="checkpoint: w holds NaN or inf"):
        save_checkpoint(out, TrainingState(config={}, epoch=1), params, optimizer, None)
    assert _snapshot(out) == before


def _plant_nan(weights: Path) -> None:
    from safetensors.numpy import load_file, save_file

    state = load_file(str(weights))
    name = sorted(k for k, v in state.items() if v.dtype.kind == "f")[0]
    state[name] = state[name].copy()
    state[name].flat[0] = np.nan
    save_file(state, str(weights))


def test_loading_a_head_with_nan_weights_is_refused(genuine: dict[str, Path], tmp_path: Path) -> None:
    from condsearch.errors import ModelError
    from condsearch.model.head import load_head
    from condsearch.model.head_files import load_numpy_head

    out = _copy(genuine, "head", tmp_path)
    load_head(out), load_numpy_head(out)  # the genuine head loads
    _plant_nan(out / "head.safetensors")
    for load in (load_head, load_numpy_head):
        with pytest.raises(ModelError, match=r"head\.safetensors.*NaN or inf"):
            load(out)


def test_indexing_through_a_head_with_nan_weights_is_one_line(
    genuine: dict[str, Path], tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    out = _copy(genuine, "head", tmp_path)
    _plant_nan(out / "head.safetensors")
    args = ("index", corpus_file, "-c", "the colour", "--model", tiny_bert_dir, "--head", out)
    assert "NaN or inf" in assert_clean_error(run(*args, "--index-dir", tmp_path / "idx"))


def test_loading_a_router_with_nan_weights_is_refused(
    genuine: dict[str, Path], tiny_bert_dir: Path, tmp_path: Path
) -> None:
    from condsearch.base.model_sources import resolve_model
    from condsearch.errors import ModelError
    from condsearch.model.csr.encoder import CsrEncoder

    out = _copy(genuine, "router", tmp_path)
    _plant_nan(out / "router.safetensors")
    # the weights' recorded size and sha256 (issue 37, 3) may refuse them before their values are read
    with pytest.raises(ModelError, match="NaN or inf|not this router's weights"):
        CsrEncoder(resolve_model(str(tiny_bert_dir)), device="cpu", router=str(out))


def test_loading_an_adapter_with_nan_weights_is_refused(
    genuine: dict[str, Path], tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    out = _copy(genuine, "lora", tmp_path)
    weights = next(out.glob("*.safetensors"))
    _plant_nan(weights)
    args = ("index", corpus_file, "-c", "the colour", "--model", tiny_bert_dir, "--profile", out)
    assert "NaN or inf" in assert_clean_error(run(*args, "--index-dir", tmp_path / "idx"))


# ----------------------------------------------------------------- issue 37 (7): float options and JSON are finite


@pytest.mark.parametrize(
    ("name", "flag", "value"),
    [
        ("full", "--anchor-weight", "nan"),
        ("full", "--layer-decay", "nan"),
        ("lora", "--blend", "nan"),
        ("lora", "--quad-margin", "inf"),
        ("lora", "--lora-alpha", "inf"),
        ("full", "--bcl-temperature", "-inf"),
        ("head", "--dropout", "nan"),
        ("head", "--lr", "inf"),
        ("router", "--lr", "nan"),
    ],
)
def test_train_refuses_non_finite_float_options(
    name: str, flag: str, value: str, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    csv = _csv(tmp_path / "t.csv")
    message = assert_clean_error(_train(name, csv, tmp_path / "out", tiny_bert_dir, flag, value), code=2)
    assert flag in message and f"{value!r} is not a finite number" in message
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]


@pytest.mark.parametrize(
    ("config", "field"),
    [("FinetuneConfig", "anchor_weight"), ("FinetuneConfig", "margin"), ("FinetuneConfig", "lr")],
)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_training_configs_refuse_non_finite_floats(config: str, field: str, value: float) -> None:
    from condsearch.train import finetune

    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        getattr(finetune, config)(kind="full", **{field: value})


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_the_other_training_configs_refuse_non_finite_floats(value: float) -> None:
    from condsearch.train.head import HeadTrainConfig
    from condsearch.train.lora import LoraConfig
    from condsearch.train.router import RouterTrainConfig

    with pytest.raises(ValueError, match="lr must be a finite number"):
        RouterTrainConfig(lr=value)
    with pytest.raises(ValueError, match="wacl_weight must be a finite number"):
        RouterTrainConfig(wacl_weight=value)
    with pytest.raises(ValueError, match="dropout must be a finite number"):
        HeadTrainConfig(dropout=value)
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        LoraConfig(alpha=value)


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("name", ["full", "router"])
def test_an_undefined_dev_score_is_written_as_null_never_nan(name: str, tiny_bert_dir: Path, tmp_path: Path) -> None:
    """A dev set whose labels are all equal has no Spearman (NaN): the summary and every JSON file say null."""
    csv = _csv(tmp_path / "t.csv")
    dev = _csv(tmp_path / "dev.csv", [(a, b, c, 3) for a, b, c, _ in ROWS])
    ckpt = tmp_path / "ckpt"
    result = ok(_train(name, csv, tmp_path / "out", tiny_bert_dir, "--dev", dev, "--checkpoint-dir", ckpt, "--json"))
    summary = _strict_json(result.stdout)
    assert isinstance(summary, dict) and summary["history"][-1]["dev_spearman"] is None
    written = [*(tmp_path / "out").rglob("*.json"), *ckpt.glob("*.json")]
    assert len(written) >= 2
    for path in written:
        _strict_json(path.read_text())


@pytest.mark.parametrize("spec", ["mse=inf", "mse=nan", "mse=1,wacl=1e400"])
def test_train_refuses_a_non_finite_loss_weight(spec: str, tiny_bert_dir: Path, tmp_path: Path) -> None:
    csv = _csv(tmp_path / "t.csv")
    message = assert_clean_error(_train("full", csv, tmp_path / "out", tiny_bert_dir, "--loss", spec), code=2)
    assert "--loss" in message and "finite" in message
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]
