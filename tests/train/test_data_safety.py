"""Writes never delete what is not condsearch's, and write failures are one-line errors, not tracebacks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from condsearch.base.atomic import (
    ARTIFACT_MARKERS,
    OutputDirError,
    artifact_kind,
    check_output_dir,
    replacing_dir,
)
from condsearch.model.head import HeadConfig, ProjectionHead, save_head
from tests.cli.test_cli import assert_clean_error, ok, run

CSV = "sentence1,sentence2,condition,label\na red dress,a blue dress,colour,2\na red hat,a red coat,colour,5\n"


def _projects(tmp_path: Path) -> Path:
    """A folder of someone's work, which no condsearch write may touch."""
    folder = tmp_path / "projects"
    (folder / "thesis").mkdir(parents=True)
    (folder / "thesis" / "chapter1.tex").write_text("years of work")
    (folder / "notes.txt").write_text("keep me")
    return folder


def _untouched(folder: Path) -> bool:
    left_behind = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    return (folder / "thesis" / "chapter1.tex").read_text() == "years of work" and not left_behind


def test_markers_are_the_writers_own_file_names() -> None:
    from condsearch.base import artifact_files as files
    from condsearch.train import checkpoint
    from condsearch.train import finetune_save as finetune_run

    assert ARTIFACT_MARKERS == {
        "checkpoint": checkpoint.STATE_FILE,
        "router": files.ROUTER_CONFIG,
        "model": finetune_run.FULL_SUMMARY_FILE,
        "adapter": files.PEFT_CONFIG,
        "head": files.HEAD_CONFIG,
    }


def test_replacing_dir_refuses_a_folder_that_is_not_an_artifact(tmp_path: Path) -> None:
    folder = _projects(tmp_path)
    with pytest.raises(OutputDirError, match="not a condsearch artifact"), replacing_dir(folder) as tmp:
        (tmp / "head.json").write_text("{}")
    assert _untouched(folder) and (folder / "notes.txt").read_text() == "keep me"


def test_replacing_dir_refuses_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _projects(tmp_path)
    monkeypatch.chdir(folder)
    for spelling in (".", "thesis/.."):
        with pytest.raises(OutputDirError, match="refusing"), replacing_dir(Path(spelling)):
            pass
    assert _untouched(folder)


def test_replacing_dir_replaces_artifacts_and_empty_folders(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with replacing_dir(empty) as tmp:
        (tmp / "head.json").write_text("1")
    with replacing_dir(empty, "head") as tmp:
        (tmp / "head.json").write_text("2")
    assert (empty / "head.json").read_text() == "2" and artifact_kind(empty) == "head"


def test_replacing_dir_refuses_another_kind(tmp_path: Path) -> None:
    folder = tmp_path / "lora"
    with replacing_dir(folder) as tmp:
        (tmp / "adapter.json").write_text("{}")
        (tmp / "head.json").write_text("{}")  # an adapter folder holds its head too
    assert artifact_kind(folder) == "adapter"
    with pytest.raises(OutputDirError, match="holds a condsearch adapter, not a head"), replacing_dir(folder, "head"):
        pass
    assert artifact_kind(folder) == "adapter"


def test_replacing_dir_refuses_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("data")
    with pytest.raises(OutputDirError, match="not a folder"), replacing_dir(path):
        pass
    assert path.read_text() == "data"


def test_check_output_dir_refuses_an_unwritable_place(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OutputDirError, match="cannot write"):
        check_output_dir(blocker / "out", "head")
    check_output_dir(tmp_path / "new" / "deeper" / "out", "head")
    assert not (tmp_path / "new").exists()  # checking creates nothing


def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any training that starts fail the test: refusals must come first."""

    def fail(*args: object, **kwargs: object) -> None:
        pytest.fail("training started before --out was checked")

    import condsearch.train.finetune_save
    import condsearch.train.head
    import condsearch.train.router

    monkeypatch.setattr(condsearch.train.head, "fit_and_save_head", fail)
    monkeypatch.setattr(condsearch.train.finetune_save, "fit_and_save_encoder", fail)
    monkeypatch.setattr(condsearch.train.router, "fit_and_save_router", fail)


@pytest.mark.parametrize(
    "flags",
    [(), ("--finetune", "lora"), ("--finetune", "full"), ("--mode", "csr")],
    ids=["head", "lora", "full", "csr"],
)
def test_train_refuses_a_foreign_out_before_training(
    flags: tuple[str, ...], tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_training(monkeypatch)
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    folder = _projects(tmp_path)
    result = run("train", csv, "--out", folder, "--model", tiny_bert_dir, *flags)
    assert_clean_error(result, match="not a condsearch artifact")
    assert _untouched(folder)


def test_train_refuses_a_foreign_checkpoint_dir(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_training(monkeypatch)
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    folder = _projects(tmp_path)
    monkeypatch.chdir(folder)
    args = ("train", csv, "--out", tmp_path / "lora", "--model", tiny_bert_dir, "--finetune", "lora")
    assert_clean_error(run(*args, "--checkpoint-dir", "."), match="not a condsearch artifact")
    assert _untouched(folder)


def test_train_refuses_an_out_of_another_kind(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_training(monkeypatch)
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    head = tmp_path / "head"
    save_head(ProjectionHead(HeadConfig(input_dim=3, dim=2)), head)  # a real head: a bare head.json is no proof
    result = run("train", csv, "--out", head, "--model", tiny_bert_dir, "--finetune", "lora")
    assert_clean_error(result, match="holds a condsearch head, not an adapter")


def test_train_refuses_an_unwritable_out(tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_training(monkeypatch)
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    (tmp_path / "a-file").write_text("x")
    result = run("train", csv, "--out", tmp_path / "a-file" / "head", "--model", tiny_bert_dir)
    assert_clean_error(result, match="cannot write")


def test_train_replaces_its_own_head(tiny_bert_dir: Path, tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    out = tmp_path / "head"
    out.mkdir()  # an empty folder is fine too
    for _ in range(2):
        ok(run("train", csv, "--out", out, "--dim", 4, "--epochs", 1, "--model", tiny_bert_dir))
    assert artifact_kind(out) == "head" and sorted(os.listdir(tmp_path)) == ["head", "t.csv"]


# ----------------------------------------------------------------- write failures: one line, non-zero exit


def _blocked(tmp_path: Path) -> Path:
    """A path below a regular file: writing there fails with a real OSError, even as root."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "below"


def test_index_into_an_unwritable_folder_is_one_line(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    args = ("index", corpus_file, "-c", "colour", "--model", tiny_bert_dir, "--head", "none")
    assert_clean_error(run(*args, "--index-dir", _blocked(tmp_path)), match="cannot write the index")


def test_index_on_a_full_disk_is_one_line(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    args = ("index", corpus_file, "-c", "colour", "--model", tiny_bert_dir, "--head", "none")
    assert_clean_error(run(*args, "--index-dir", tmp_path / "ix"), match="No space left on device")
    from condsearch.store.folder import IndexStore

    assert IndexStore(tmp_path / "ix").names() == []


def test_train_with_an_unwritable_cache_is_one_line(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(_blocked(tmp_path)))
    result = run("train", csv, "--out", tmp_path / "head", "--dim", 4, "--epochs", 1, "--model", tiny_bert_dir)
    assert_clean_error(result, match="a-file")


def test_train_denied_writing_the_head_is_one_line(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    def denied(tensors: object, path: str, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(safetensors.torch, "save_file", denied)  # what every artifact's weights are written with
    csv = tmp_path / "t.csv"
    csv.write_text(CSV)
    result = run("train", csv, "--out", tmp_path / "head", "--dim", 4, "--epochs", 1, "--model", tiny_bert_dir)
    message = assert_clean_error(result, match="Permission denied")
    assert message.endswith("head.safetensors: Permission denied")
    assert not (tmp_path / "head").exists()
