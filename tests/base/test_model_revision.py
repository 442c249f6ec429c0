"""A local model folder's revision: the sha256 of its weights whole, hashed again only when a file changes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import condsearch.base.file_digest as file_digest
from condsearch.base.model_sources import resolve_model
from condsearch.errors import ModelError

SIZE = 12 << 20  # past the 4 MiB at each end that the revision once read


def _folder(where: Path, *, seed: int = 0) -> Path:
    """A folder that resolves as a model: a config and 12 MiB of weights (never loaded here)."""
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    (where / "model.safetensors").write_bytes(os.urandom(SIZE) if seed else bytes(range(256)) * (SIZE // 256))
    (where / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nred\n")
    return where


def _zero_middle(path: Path, n: int = 1 << 20) -> None:
    """Zero n bytes in the middle of a file, keeping its size and modification time (its change time moves)."""
    info = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(info.st_size // 2)
        fh.write(b"\0" * n)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a minute pass for the settle rule: files written just now may be stamped."""
    later = file_digest.time.time_ns() + 60 * 10**9
    monkeypatch.setattr(file_digest.time, "time_ns", lambda: later)


def test_bytes_zeroed_in_the_middle_of_the_weights_change_the_revision(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    good = resolve_model(str(folder)).revision
    assert good.startswith("dir-") and resolve_model(str(folder)).revision == good
    _zero_middle(folder / "model.safetensors")
    assert resolve_model(str(folder)).revision != good


def test_a_damaged_file_is_seen_even_after_its_digest_was_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "m")
    _settle(monkeypatch)
    hashed: list[str] = []
    real = file_digest.sha256_file
    monkeypatch.setattr(file_digest, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
    good = resolve_model(str(folder)).revision
    assert sorted(hashed) == ["model.safetensors", "vocab.txt"]
    hashed.clear()
    assert resolve_model(str(folder)).revision == good and hashed == []  # the stamp stands for the hash
    _zero_middle(folder / "model.safetensors")  # size and mtime kept: the change time moves
    assert resolve_model(str(folder)).revision != good and hashed == ["model.safetensors"]


def test_a_copied_folder_keeps_its_revision_and_other_weights_or_vocabulary_do_not(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert resolve_model(str(copy)).revision == resolve_model(str(folder)).revision
    other = _folder(tmp_path / "other", seed=1)  # same size, other bytes
    assert resolve_model(str(other)).revision != resolve_model(str(folder)).revision
    (copy / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nblue\n")
    assert resolve_model(str(copy)).revision != resolve_model(str(folder)).revision


def test_a_file_written_just_now_is_never_stamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "m")
    hashed: list[str] = []
    real = file_digest.sha256_file
    monkeypatch.setattr(file_digest, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
    resolve_model(str(folder))
    resolve_model(str(folder))
    assert hashed.count("model.safetensors") == 2  # a change within the same timestamp tick could go unseen


def test_an_unreadable_weights_file_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "m")

    def refused(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(file_digest, "sha256_file", refused)
    with pytest.raises(ModelError, match="model.safetensors: unreadable") as err:
        resolve_model(str(folder))
    assert "\n" not in str(err.value)


def test_a_read_only_cache_still_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "m")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "digests").write_text("not a folder")  # nothing can be kept there
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(cache))
    _settle(monkeypatch)
    assert resolve_model(str(folder)).revision == resolve_model(str(folder)).revision
