"""An output never replaces what is not a regular file (issue 58, item 3).

``pairs --out /dev/null`` as root renamed a regular file over the machine's ``/dev/null``,
``/dev/full`` "succeeded" and a FIFO was replaced. Every file output is written through
:func:`condsearch.base.atomic.replacing_file`, which now refuses a device, a FIFO, a socket or a
folder before anything is written. The devices are only ever asked about in ways that cannot
replace them: the refusal comes before the block runs, and the tests check they are still devices.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.base.atomic import OutputFileError, check_replaceable_file, replacing_file
from condsearch.cli import main

DEVICES = [Path("/dev/null"), Path("/dev/full")]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.csv"
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))  # a socket's path must be short
    path = folder / "s.csv"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        yield path
    path.unlink()
    folder.rmdir()


def _is_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_a_device_is_refused_before_the_block_runs(device: Path) -> None:
    if not device.exists():
        pytest.skip(f"no {device} here")
    ran = False
    with pytest.raises(OutputFileError, match="character device, not a regular file; refusing to replace it") as exc:
        with replacing_file(device):
            ran = True  # never: nothing may be written, let alone renamed over the device
    assert not ran and "\n" not in str(exc.value)
    assert _is_device(device)


def test_a_fifo_a_socket_and_a_folder_are_refused_and_stay(fifo: Path, unix_socket: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, kind in ((fifo, r"a FIFO \(named pipe\)"), (unix_socket, "a socket"), (folder, "a folder")):
        with pytest.raises(OutputFileError, match=f"{kind}, not a regular file"):
            with replacing_file(path) as tmp:
                tmp.write_text("never")
        assert not list(path.parent.glob(".tmp-*"))
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and stat.S_ISSOCK(unix_socket.lstat().st_mode) and folder.is_dir()


def test_a_fifo_that_appears_while_the_block_runs_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    with pytest.raises(OutputFileError, match="FIFO"):
        with replacing_file(path) as tmp:
            tmp.write_text("rows\n")
            os.mkfifo(path)
    assert stat.S_ISFIFO(path.lstat().st_mode) and not tmp.exists()


def test_a_regular_file_and_a_link_are_still_replaced(tmp_path: Path) -> None:
    old, link = tmp_path / "old.csv", tmp_path / "link.csv"
    old.write_text("old\n")
    link.symlink_to(Path("/dev/null"))  # the link is replaced, never what it names
    for path in (old, link):
        check_replaceable_file(path)
        with replacing_file(path) as tmp:
            tmp.write_text("new\n")
        assert path.read_text() == "new\n" and not path.is_symlink()
    assert _is_device(Path("/dev/null"))


def _table(path: Path) -> Path:
    kinds, makers = ["shoe", "shirt", "hat", "bag"], ["acme", "zenith", "nova"]
    rows = [(f"item {i}: a {makers[i % 3]} {kinds[i % 4]}", kinds[i % 4], makers[i % 3]) for i in range(24)]
    pq.write_table(
        pa.table({"text": [r[0] for r in rows], "category": [r[1] for r in rows], "brand": [r[2] for r in rows]}), path
    )
    return path


def test_pairs_out_a_fifo_is_a_one_line_error_before_any_work(tmp_path: Path, fifo: Path) -> None:
    table = _table(tmp_path / "c.parquet")
    result = CliRunner().invoke(
        main, ["pairs", str(table), "--label", "category=kind", "--label", "brand=maker", "--out", str(fifo)]
    )
    assert result.exit_code == 1, result.output
    assert "FIFO (named pipe), not a regular file; refusing to replace it" in result.output
    assert result.output.count("\n") == 1
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_pairs_refuses_a_device_before_reading_the_table(tmp_path: Path) -> None:
    from condsearch.train.pairs_files import check_output

    for device in DEVICES:
        if device.exists():
            with pytest.raises(OutputFileError, match="character device"):
                check_output(device, [tmp_path / "c.parquet"])  # checks, writes nothing
            assert _is_device(device)


def test_demo_corpus_into_a_fifo_is_refused_without_blocking(fifo: Path) -> None:
    # a subprocess with a timeout: before the fix, the write into the FIFO waited for a reader for ever
    done = subprocess.run(
        [sys.executable, "-m", "condsearch", "demo-corpus", str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "FIFO (named pipe), not a regular file; refusing to replace it" in done.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize(("command", "flag"), [("head", "--out"), ("router", "--out"), ("router", "--checkpoint-dir")])
def test_train_outputs_at_a_fifo_are_refused_before_training(
    tmp_path: Path, fifo: Path, command: str, flag: str
) -> None:
    train = tmp_path / "train.csv"
    train.write_text("sentence1,sentence2,condition,label\na,b,c,5\n")
    outputs = {"--out": str(tmp_path / "out"), flag: str(fifo)}
    if command == "router":
        outputs = {"--checkpoint-dir": str(tmp_path / "checkpoints"), **outputs}
    args = ["train", command, str(train), "--model", str(tmp_path / "no-model")]
    result = CliRunner().invoke(main, [*args, *(x for pair in outputs.items() for x in pair)])
    assert result.exit_code == 1, result.output
    assert "exists and is not a folder; refusing to replace it" in result.output
    assert result.output.count("\n") == 1
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_an_index_dir_at_a_fifo_is_refused(fifo: Path, hash_encoder) -> None:
    from condsearch.errors import StoreError
    from condsearch.store.folder import IndexStore

    with pytest.raises(StoreError, match="cannot write the index"):
        with IndexStore(fifo).writing("corpus", "the colour"):
            pass
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
