"""The shared write steps of condsearch.base.atomic: a file or a folder moves in whole, or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from condsearch.base.atomic import replacing_file, swap_dir, temporary_name


def test_temporary_name_is_hidden_beside_the_path_and_fresh(tmp_path: Path) -> None:
    first, second = temporary_name(tmp_path / "rows.parquet"), temporary_name(tmp_path / "rows.parquet")
    assert first.parent == tmp_path and first.name.startswith(".tmp-rows.parquet-") and first != second
    assert not first.exists()


def test_replacing_file_moves_a_finished_file_in(tmp_path: Path) -> None:
    target = tmp_path / "progress.json"
    target.write_text("old")
    with replacing_file(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"  # nothing is seen before the block ends
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["progress.json"]


def test_replacing_file_leaves_the_old_file_when_the_block_fails(tmp_path: Path) -> None:
    target = tmp_path / "shard.npz"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["shard.npz"]


def test_replacing_file_flips_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    link = tmp_path / "index"
    link.symlink_to("v1")
    with replacing_file(link) as tmp:
        tmp.symlink_to("v2")
    assert os.readlink(link) == "v2" and sorted(os.listdir(tmp_path)) == ["index", "v1", "v2"]


@pytest.mark.parametrize("existing", [True, False])
def test_swap_dir_replaces_a_folder_and_leaves_nothing_aside(tmp_path: Path, existing: bool) -> None:
    folder = tmp_path / "export"
    if existing:
        folder.mkdir()
        (folder / "stale").write_text("old")
    new = tmp_path / ".export-new"
    new.mkdir()
    (new / "model.onnx").write_text("new")
    swap_dir(new, folder)
    assert os.listdir(folder) == ["model.onnx"] and os.listdir(tmp_path) == ["export"]
