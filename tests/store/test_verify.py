"""`condsearch verify`: the full checksum check that loading leaves out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from condsearch.store.folder import INDEX_FILE, IndexStore
from tests.cli.test_cli import COLOUR, SPORT, assert_clean_error, json_lines, ok, run


@pytest.fixture
def indexed(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> Path:
    """The small corpus indexed under two conditions with the tiny BERT and no head."""
    folder = tmp_path / "indexes"
    ok(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "-c",
            SPORT,
            "--model",
            tiny_bert_dir,
            "--head",
            "none",
            "--index-dir",
            folder,
        )
    )
    return folder


def test_verify_reports_every_index(indexed: Path) -> None:
    rows = json_lines(ok(run("verify", "--json", "--index-dir", indexed)).stdout)
    assert sorted(r["condition"] for r in rows) == sorted([COLOUR, SPORT])
    assert all(r["ok"] and r["rows"] == 8 for r in rows)
    text = ok(run("verify", "-c", SPORT, "--index-dir", indexed)).stdout
    assert text.startswith("ok") and repr(SPORT) in text and COLOUR not in text


def test_verify_finds_a_damaged_index_and_exits_1(indexed: Path) -> None:
    store = IndexStore(indexed)
    damaged = store.find(COLOUR)
    path = indexed / damaged / INDEX_FILE
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: only a full hash tells
    result = run("verify", "--json", "--index-dir", indexed)
    assert_clean_error(result, match="1 of 2 index(es) failed verification")
    rows = {r["index"]: r for r in json_lines(result.stdout)}
    assert rows[damaged]["ok"] is False and "damaged" in rows[damaged]["error"]
    assert rows[store.find(SPORT)]["ok"] is True


def test_verify_unknown_condition_and_empty_store(indexed: Path, tmp_path: Path) -> None:
    assert_clean_error(run("verify", "-c", "mood", "--index-dir", indexed), match="no index for condition 'mood'")
    assert_clean_error(run("verify", "--corpus", "corpus", "--index-dir", indexed), code=2)
    empty = ok(run("verify", "--index-dir", tmp_path / "none"))
    assert empty.stdout == "" and "no indexes" in empty.stderr
