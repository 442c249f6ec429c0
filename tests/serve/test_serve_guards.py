"""The server's guards at start and at the door (issue 58, items 6 to 9).

Item 6: a keyless server on loopback answers 421 to a Host that is not this machine's (DNS rebinding).
Item 7: an empty API key, by flag or environment, stops `serve` at start in one line. Item 8: no answer
names a path of the server's machine (a damaged store, a full disk, the listing, the health check).
Item 9: a bad environment setting stops `serve` at start in one line, not as a 500 on every query.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CondsearchError
from condsearch.ingest.chunks import index_corpus
from condsearch.serve.config import API_KEY_ENV, ServeConfig
from condsearch.serve.paths import hide_paths
from condsearch.serve.server import BackgroundServer, build_app
from condsearch.store.folder import IndexStore
from tests.csr_corpus import write_csr_corpus
from tests.query.test_on_demand import COLOUR, SPORT, index
from tests.serve.test_serve_builds import one_line_error, poll, serve
from tests.serve.test_serve_hostile import make_app


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    from tests.serve.test_serve_embeddings import hash_vectorizer

    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR], hash_vectorizer(), store, corpus_name="corpus")
    return store


# ---------------------------------------------------------------- item 6: DNS rebinding


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", ""])
def test_a_keyless_loopback_server_answers_only_its_own_names(store: IndexStore, host: str) -> None:
    with BackgroundServer(make_app(store)) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        port = server.url.rsplit(":", 1)[1]
        refused = http.get("/indexes", headers={"Host": host.format(port=port)})
        assert refused.status_code == 421, refused.text
        assert "localhost only" in refused.json()["error"] and refused.headers["x-frame-options"] == "DENY"
        posted = http.post("/query", json={"query": "q", "condition": COLOUR}, headers={"Host": host.format(port=port)})
        assert posted.status_code == 421
        for own in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
            assert http.get("/indexes", headers={"Host": own}).status_code == 200, own


def test_the_ipv6_loopback_name_is_its_own(store: IndexStore) -> None:
    try:
        server = BackgroundServer(make_app(store), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        port = server.url.rsplit(":", 1)[1]
        assert http.get("/health").status_code == 200  # httpx sends [::1]:port
        assert http.get("/health", headers={"Host": f"evil.example:{port}"}).status_code == 421


def test_a_server_with_a_key_is_not_host_checked(store: IndexStore) -> None:
    with BackgroundServer(make_app(store, api_key="k3y")) as server, httpx.Client(base_url=server.url) as http:
        headers = {"Host": "evil.example", "X-API-Key": "k3y"}
        assert http.get("/indexes", headers=headers).status_code == 200  # the page has no key: it gets a 401
        assert http.get("/indexes", headers={"Host": "evil.example"}).status_code == 401


# ---------------------------------------------------------------- items 7 and 9: refused at start


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    import condsearch.serve.server as server

    configs: list[ServeConfig] = []
    monkeypatch.setattr(server, "run_server", configs.append)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    return configs


def _refused_at_start(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, ["serve", *args], env=env)
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError | TypeError)
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    return line


@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_is_refused_at_start(started: list[ServeConfig], tmp_path: Path, key: str) -> None:
    assert "API key is empty" in _refused_at_start(["--api-key", key, "--index-dir", str(tmp_path)])
    assert "API key is empty" in _refused_at_start(["--index-dir", str(tmp_path)], env={API_KEY_ENV: key})
    assert started == []
    with pytest.raises(CondsearchError, match="API key is empty"):
        ServeConfig(api_key=key)


def test_a_key_from_the_environment_still_starts(started: list[ServeConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--index-dir", str(tmp_path)], env={API_KEY_ENV: "k3y"})
    assert result.exit_code == 0, result.output
    assert started[0].api_key == "k3y"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("CONDSEARCH_CPU_KIND", "amx2", "is no CPU kind"),
        ("CONDSEARCH_CACHE_DIR", "{file}", "is not a folder"),
    ],
)
def test_a_bad_environment_setting_stops_serve_at_start(
    started: list[ServeConfig], tmp_path: Path, name: str, value: str, says: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    line = _refused_at_start([], env={name: value.format(file=file)})
    assert name in line and says in line
    assert started == []


# ---------------------------------------------------------------- item 8: no path of the machine


def test_hide_paths_cuts_this_machines_paths_and_keeps_api_paths(tmp_path: Path) -> None:
    message = f"{tmp_path}/idx/colour-5c5e39/manifest.json: corrupt manifest; poll GET /builds/ab12 or /v1/embeddings"
    assert hide_paths(message) == "manifest.json: corrupt manifest; poll GET /builds/ab12 or /v1/embeddings"
    assert hide_paths({"error": [f"'{tmp_path}'"]}) == {"error": [f"'{tmp_path.name}'"]}
    assert hide_paths("see https://example.org/tmp/x") == "see https://example.org/tmp/x"


@pytest.fixture
def csr_folder(tmp_path: Path, tiny_bert_dir: Path) -> Path:
    out = tmp_path / "idx"
    index(write_csr_corpus(tmp_path / "c.parquet"), out, tiny_bert_dir, COLOUR)
    return out


def _no_path(text: str, *paths: Path) -> None:
    for path in paths:
        assert str(path) not in text and os.path.realpath(path) not in text, text
    assert "/tmp/" not in text and "/work/" not in text and "/root/" not in text, text


def test_a_full_disk_is_a_409_naming_no_path(
    csr_folder: Path, tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: object, **__: object) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(csr_folder / ".versions" / "x"))

    monkeypatch.setattr(IndexStore, "_write_version", full)
    with serve(csr_folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.post("/query", json={"query": "q", "condition": SPORT})
        error = one_line_error(response, 409)
        assert "No space left on device" in error
        _no_path(response.text, csr_folder, tmp_path, tiny_bert_dir)
    with serve(csr_folder, build_inline_rows=0) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        accepted = http.post("/query", json={"query": "q", "condition": SPORT})
        assert accepted.status_code == 202, accepted.text
        failed = poll(http, accepted.json()["job"], {"done", "failed"})
        assert failed["status"] == "failed" and "No space left on device" in failed["error"]
        _no_path(str(failed), csr_folder, tmp_path, tiny_bert_dir)


def test_a_damaged_store_is_answered_naming_no_path(csr_folder: Path, tmp_path: Path, tiny_bert_dir: Path) -> None:
    [name] = IndexStore(csr_folder).names()
    (csr_folder / name / "manifest.json").write_text("{ damaged")
    config = ServeConfig(index_dir=csr_folder, reload_interval_s=0.05, device="cpu")
    with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for response in (
            http.post("/query", json={"query": "q", "condition": COLOUR}),
            http.post("/query", json={"query": "q", "condition": SPORT}),
            http.get("/indexes"),
            http.post("/v1/embeddings", json={"input": "q", "condition": COLOUR}),
        ):
            assert response.status_code < 500, response.text
            _no_path(response.text, csr_folder, tmp_path, tiny_bert_dir)
        assert "corrupt manifest" in http.get("/indexes").json()["indexes"][0]["error"]


def test_the_listing_and_health_name_a_local_model_by_its_folder_name(
    csr_folder: Path, tmp_path: Path, tiny_bert_dir: Path
) -> None:
    with serve(csr_folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.post("/query", json={"query": "q", "condition": COLOUR}).status_code == 200
        listed = http.get("/indexes")
        assert listed.json()["indexes"][0]["model"] == tiny_bert_dir.name
        embedded = http.post("/v1/embeddings", json={"input": "q", "condition": COLOUR, "model": tiny_bert_dir.name})
        # a router corpus's model is named with its router (GET /v1/models, tests/serve/test_serve_ops.py)
        assert embedded.status_code == 200 and embedded.json()["model"].startswith(f"{tiny_bert_dir.name}+router:")
        for response in (listed, http.get("/health"), embedded):
            _no_path(response.text, csr_folder, tmp_path, tiny_bert_dir)
