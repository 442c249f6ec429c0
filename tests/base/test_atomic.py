"""Folder replacement: the old copy or the new, whole, whatever happens in between."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from condsearch.base.atomic import ARTIFACT_MARKERS, recover_dir, replacing_dir


def _write(folder: Path, text: str) -> None:
    (folder / "a.txt").write_text(text)
    (folder / "b.txt").write_text(text)
    (folder / ARTIFACT_MARKERS["head"]).write_text("{}")  # only a condsearch artifact is replaced


def test_replaces_whole_and_leaves_no_temporaries(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    for text in ("one", "two"):
        with replacing_dir(dest) as tmp:
            _write(tmp, text)
    assert (dest / "a.txt").read_text() == (dest / "b.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failing_write_leaves_the_old_copy(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with replacing_dir(dest) as tmp:
        _write(tmp, "old")
    with pytest.raises(RuntimeError), replacing_dir(dest) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("killed")
    assert (dest / "a.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_crash_between_the_renames_is_recovered(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with replacing_dir(dest) as tmp:
        _write(tmp, "old")
    os.replace(dest, tmp_path / ".out.previous")  # the first rename of a replacement, then the crash
    recover_dir(dest)
    assert (dest / "a.txt").read_text() == "old"
    with replacing_dir(dest) as tmp:  # and a later replacement works as usual
        _write(tmp, "new")
    assert (dest / "b.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
