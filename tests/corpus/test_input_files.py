"""Every file condsearch is given to read is a regular file, or a one-line refusal (issue 58, item 5).

Training data of ``/dev/zero`` was read without end (17.5 GB, then the OOM killer) and a FIFO as
``--dev`` hung: ``read_csts`` skipped the check corpus files have. Training and dev CSVs, pairs
tables, routers', heads' and adapters' files (what a profile is) and checkpoints are now opened
without blocking and refused unless regular. Each case runs in a child process with a memory
limit and a timeout, so that a regression fails the test instead of hanging or exhausting the machine.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: enough for torch and a tiny model; /dev/zero read whole would pass it in a second
MEMORY_LIMIT = 4 << 30
TIMEOUT_S = 120


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a python command line in a child process, bounded in memory and time."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=_limit_memory,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _refused(code: str, error: str, match: str) -> None:
    """Run code in a child process; it must raise error (a class name) whose one-line message holds match."""
    program = textwrap.dedent(f"""
        import sys
        try:
            {code.strip()}
        except Exception as exc:
            print(type(exc).__name__, str(exc), sep="|")
            sys.exit(0)
        sys.exit("no error")
    """)
    done = _run("-c", program)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, message = done.stdout.strip().split("|", 1)
    assert kind == error and match in message and "\n" not in message, done.stdout


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.csv"
    os.mkfifo(path)
    return path


def _csts(path: Path) -> Path:
    path.write_text("sentence1,sentence2,condition,label\na girl,a boy,the colour,5\na dog,a cat,the sport,1\n")
    return path


@pytest.mark.parametrize("name", ["/dev/zero", "fifo"])
def test_read_csts_refuses_a_device_or_a_fifo(name: str, fifo: Path) -> None:
    path = fifo if name == "fifo" else Path(name)
    kind = "a FIFO (named pipe)" if name == "fifo" else "a character device"
    _refused(
        f"from condsearch.corpus.csts import read_csts; read_csts({str(path)!r})",
        "CorpusError",
        f"{path}: {kind}, not a regular file; refusing to read it",
    )


def test_read_csts_still_reads_a_link_to_a_regular_file(tmp_path: Path) -> None:
    from condsearch.corpus.csts import read_csts

    link = tmp_path / "link.csv"
    link.symlink_to(_csts(tmp_path / "train.csv"))
    assert len(read_csts(link)) == 2


@pytest.mark.parametrize(("which", "name"), [("--dev", "fifo"), ("--dev", "/dev/zero"), ("train", "/dev/zero")])
def test_train_with_a_device_or_fifo_for_data_is_a_one_line_error(
    tmp_path: Path, fifo: Path, tiny_bert_dir: Path, which: str, name: str
) -> None:
    path = str(fifo if name == "fifo" else name)
    train = path if which == "train" else str(_csts(tmp_path / "train.csv"))
    dev = ["--dev", path] if which == "--dev" else []
    args = ["train", "head", train, *dev, "--out", str(tmp_path / "head"), "--model", str(tiny_bert_dir)]
    done = _run("-m", "condsearch", *args, "--epochs", "1")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "not a regular file; refusing to read it" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "head").exists()


def test_pairs_names_what_its_table_is(fifo: Path, tmp_path: Path) -> None:
    done = _run(
        "-m", "condsearch", "pairs", str(fifo), "--label", "a=b", "--label", "c=d", "--out", str(tmp_path / "p.csv")
    )
    assert done.returncode == 1 and "a FIFO (named pipe), not a regular file" in done.stderr, done.stderr


def _saved_head(folder: Path) -> Path:
    import torch

    from condsearch.model.artifacts.heads import HeadConfig
    from condsearch.model.head import ProjectionHead, save_head

    torch.manual_seed(0)
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=8)), folder)
    return folder


@pytest.mark.parametrize("file_name", ["head.json", "head.safetensors"])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_head_file_that_is_a_fifo_or_a_device_is_refused(tmp_path: Path, file_name: str, special: str) -> None:
    folder = _saved_head(tmp_path / "head")
    (folder / file_name).unlink()
    if special == "fifo":
        os.mkfifo(folder / file_name)
    else:
        (folder / file_name).symlink_to(special)
    kind = "a FIFO (named pipe)" if special == "fifo" else "a character device"
    for call in ("load_head", "head_checksum"):
        module = "condsearch.model.head" if call == "load_head" else "condsearch.model.artifacts.heads"
        if call == "head_checksum" and file_name == "head.json":
            continue  # the checksum is the weights'
        _refused(f"from {module} import {call}; {call}({str(folder)!r})", "ModelError", f"{kind}, not a regular file")


def _router_without_a_record(tmp_path: Path) -> Path:
    import json

    from condsearch.base.artifact_files import DEFAULT_ROUTER_DIR

    folder = tmp_path / "router"
    shutil.copytree(DEFAULT_ROUTER_DIR, folder)
    meta = json.loads((folder / "router.json").read_text())
    del meta["weights"], meta["backbone_delta"]  # as written before either record existed: the weights are hashed
    (folder / "router.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("file_name", ["router.json", "router.safetensors"])
def test_a_router_file_that_is_a_fifo_or_a_device_is_refused(tmp_path: Path, file_name: str) -> None:
    folder = _router_without_a_record(tmp_path)
    (folder / file_name).unlink()
    if file_name == "router.json":
        os.mkfifo(folder / file_name)
        kind = "a FIFO (named pipe)"
    else:
        (folder / file_name).symlink_to("/dev/zero")
        kind = "a character device"
    _refused(
        "from condsearch.model.artifacts.routers import checked_router_checksum; "
        f"checked_router_checksum({str(folder)!r})",
        "ModelError",
        f"{kind}, not a regular file",
    )


def test_a_checkpoint_state_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    os.mkfifo(folder / "checkpoint.json")
    code = f"""
            import torch
            from condsearch.train.checkpoint import load_checkpoint
            p = {{"w": torch.nn.Parameter(torch.zeros(2))}}
            load_checkpoint({str(folder)!r}, {{}}, p, torch.optim.SGD(p.values(), lr=0.1))
    """
    _refused(code, "ModelError", "a FIFO (named pipe), not a regular file")
