"""The `serve` command's shell (flags, warnings, API key from the environment) and the lazy imports
that keep one-shot commands quick."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.serve.config import API_KEY_ENV, ServeConfig, is_loopback


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    """Replace the uvicorn run with a recorder of the config it would have served."""
    import condsearch.serve.server as server

    configs: list[ServeConfig] = []
    monkeypatch.setattr(server, "run_server", configs.append)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    return configs


def test_serve_defaults_come_from_the_config(started: list[ServeConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--index-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [config] = started
    assert (config.host, config.port, config.api_key) == ("127.0.0.1", 8000, None)
    assert (config.max_batch, config.batch_window_ms) == (ServeConfig.max_batch, ServeConfig.batch_window_ms)
    assert config.max_body_bytes == ServeConfig.max_body_bytes
    assert config.max_batch_tokens == ServeConfig.max_batch_tokens
    assert config.index_dir == tmp_path and config.store is None and "warning" not in result.stderr


def test_serve_max_body_bytes(started: list[ServeConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--max-body-bytes", "4096", "--index-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert started[0].max_body_bytes == 4096
    assert CliRunner().invoke(main, ["serve", "--max-body-bytes", "0"]).exit_code == 2


def test_serve_max_batch_tokens(started: list[ServeConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--max-batch-tokens", "512", "--index-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert started[0].max_batch_tokens == 512
    assert CliRunner().invoke(main, ["serve", "--max-batch-tokens", "0"]).exit_code == 2


def test_serve_on_all_interfaces_warns(started: list[ServeConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--port", "9001", "--index-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "warning: listening on 0.0.0.0" in result.stderr and "--api-key" in result.stderr
    assert (started[0].host, started[0].port) == ("0.0.0.0", 9001)


def test_serve_api_key_from_the_environment(
    started: list[ServeConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    result = CliRunner().invoke(main, ["serve", "--host", "::", "--index-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert started[0].api_key == "from-env"
    assert "warning" in result.stderr and "--api-key" not in result.stderr


def test_serve_store(started: list[ServeConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--store names a Milvus database to serve instead of --index-dir; naming both, or no database, is refused."""
    (tmp_path / "m.db" / "collections").mkdir(parents=True)  # a milvus-lite 3 database's folder
    (tmp_path / "m.db" / "LOCK").touch()
    db = f"milvus-lite:{tmp_path / 'm.db'}"
    monkeypatch.setenv("CONDSEARCH_INDEX_DIR", str(tmp_path / "from-env"))  # an environment default is no conflict
    result = CliRunner().invoke(main, ["serve", "--store", db])
    assert result.exit_code == 0, result.output
    assert started[0].store == db
    both = CliRunner().invoke(main, ["serve", "--store", db, "--index-dir", str(tmp_path)])
    assert both.exit_code == 2 and "--index-dir and --store" in both.output
    for bad in ("milvus:x", f"milvus-lite:{tmp_path / 'absent.db'}", "milvus://nohost"):
        refused = CliRunner().invoke(main, ["serve", "--store", bad])
        assert refused.exit_code == 2 and "--store" in refused.output, refused.output
    assert len(started) == 1


@pytest.mark.parametrize("port", ["0", "70000", "http"])
def test_serve_bad_port_is_usage_error(started: list[ServeConfig], port: str) -> None:
    assert CliRunner().invoke(main, ["serve", "--port", port]).exit_code == 2 and not started


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.4", False), ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print('\\nMODULES', ' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # the last line only: a command's own output (--help's text says "torch") is not a module list
    last = out.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith("MODULES "), out[-500:]
    return set(last.split()[1:])


HEAVY = {"torch", "transformers", "faiss", "fastapi", "uvicorn"}


def test_importing_the_cli_loads_no_heavy_library() -> None:
    assert _modules_after("import condsearch.cli") & HEAVY == set()


def test_list_and_help_load_no_model_library(tmp_path: Path) -> None:
    for argv in (["list", "--index-dir", str(tmp_path)], ["--help"], ["query", "--help"], ["serve", "--help"]):
        code = f"from condsearch.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
        loaded = _modules_after(code)
        assert loaded & {"torch", "transformers", "fastapi", "uvicorn"} == set(), argv


def test_a_repeated_one_shot_query_loads_no_transformers(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    folder = str(tmp_path / "indexes")
    flags = ["--model", str(tiny_bert_dir), "--head", "none", "--index-dir", folder]
    assert CliRunner().invoke(main, ["index", str(corpus_file), "-c", "colour", *flags]).exit_code == 0
    argv = ["query", "a girl in a red dress", "-c", "colour", "-k", "2", "--index-dir", folder]
    code = (
        f"from condsearch.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code"
    )
    _modules_after(code)  # the first query caches the ONNX export of the model
    assert "transformers" not in _modules_after(code)
