"""Hub models record the commit they resolve to, before and after the first download (offline: a fake hub cache)."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants

from condsearch.base.model_sources import resolve_model

REPO = "some-org/some-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_config(cache: Path, repo: str = REPO, commit: str = COMMIT) -> Path:
    """Lay out config.json as huggingface_hub's cache keeps it: refs/main names the snapshot's commit."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return snapshot / "config.json"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_cached_model_records_its_snapshot_commit(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cache_config(hub_cache)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("downloaded a cached model"))
    source = resolve_model(REPO)
    assert (source.model_id, source.revision, source.local) == (REPO, COMMIT, False)


def test_a_model_not_yet_downloaded_records_the_commit_it_downloads(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    downloads: list[tuple[str, str]] = []

    def download(repo_id: str, filename: str, **kwargs: object) -> str:
        downloads.append((repo_id, filename))
        return str(_cache_config(hub_cache, repo_id))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    first = resolve_model(REPO)  # what `index` records, before the weights are fetched
    assert first.revision == COMMIT and downloads == [(REPO, "config.json")]
    # the next `query` finds the model in the cache and resolves to the same commit, so the index is not refused
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("downloaded twice"))
    assert resolve_model(REPO).revision == first.revision


def test_an_unreachable_hub_leaves_main_for_loading_to_report(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> str:
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    assert resolve_model(REPO).revision == "main"
