"""Progress bars: drawn on a terminal only, and silenced by `condsearch --quiet`."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from condsearch import progress
from condsearch.cli import main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _loud() -> Iterator[None]:
    progress.set_quiet(False)
    yield
    progress.set_quiet(False)  # the switch is process-wide: leave it as the other tests expect


def _draw(monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, **kwargs: object) -> str:
    monkeypatch.setattr("sys.stderr", stream)
    with progress.progress_bar(total=3, desc="encoding", unit="row", **kwargs) as bar:  # type: ignore[arg-type]
        bar.update(3)
    return stream.getvalue()


def test_a_bar_shows_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "encoding" in _draw(monkeypatch, _Terminal())


def test_a_bar_is_off_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _draw(monkeypatch, io.StringIO()) == ""


def test_a_bar_that_is_not_enabled_stays_off_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _draw(monkeypatch, _Terminal(), enabled=False) == ""


def test_quiet_turns_a_terminal_bar_off(monkeypatch: pytest.MonkeyPatch) -> None:
    progress.set_quiet(True)
    assert _draw(monkeypatch, _Terminal()) == ""


@pytest.mark.parametrize("quiet", [False, True])
def test_the_quiet_option_silences_the_index_bar(
    quiet: bool, tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tqdm.auto

    terminal = _Terminal()

    class OnTerminal(tqdm.auto.tqdm):  # type: ignore[misc, valid-type]
        """tqdm drawing to a terminal, whatever click's test runner puts on stderr."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **{**kwargs, "file": terminal})

    monkeypatch.setattr(tqdm.auto, "tqdm", OnTerminal)
    argv = ["index", str(corpus_file), "-c", "color of the dress", "--model", str(tiny_bert_dir), "--head", "none"]
    argv += ["--index-dir", str(tmp_path / "indexes")]
    result = CliRunner().invoke(main, ["--quiet", *argv] if quiet else argv)
    assert result.exit_code == 0, result.output
    assert ("indexing" in terminal.getvalue()) is not quiet
