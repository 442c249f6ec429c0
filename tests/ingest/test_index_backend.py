"""`condsearch index --backend`: onnxruntime on the CPU wherever a one-shot query would run the index's
model, writing the same index (manifest, fingerprint, vectors up to float32 noise) as torch does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.model.encoders.cpu import available_cores
from condsearch.model.encoders.onnx import export as onnx_export
from condsearch.model.encoders.onnx.bert import OnnxBertEncoder
from condsearch.model.encoders.onnx.cache import CACHE_SUBDIR
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.head import HeadConfig, ProjectionHead, save_head
from condsearch.model.policy import backend_of, load_bulk_vectorizer, vectorizer_for
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, assert_same_ranking
from tests.model.encoders.test_onnx_trace import _adapter
from tests.tolerance import assert_rows_close, vector_tolerance

COLOUR = "color of the dress"
QUERIES = [SENTENCES[2], SENTENCES[5], "a girl in a red shirt plays tennis"]
#: manifest fields that differ between two builds of the same index: when, and the checksums of files
#: whose float32 vectors differ in their last bits (their sizes are compared)
_PER_BUILD = ("created_at", "index_mtime_ns", "index_checksum", "index_probe")


def index(corpus: Path, index_dir: Path, model: Path, *extra: object) -> dict[str, Any]:
    argv = ["index", corpus, "-c", COLOUR, "--model", model, "--device", "cpu", "--json", "--index-dir", index_dir]
    result = CliRunner().invoke(main, [str(a) for a in [*argv, *extra]])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    [row] = [json.loads(line) for line in result.stdout.splitlines()]
    # a re-index that finds every row kept says so and names no backend (nothing ran)
    assert f"encoded on {row['backend']}" in result.stderr or "nothing to encode" in result.stderr
    return row


def stored(index_dir: Path) -> tuple[dict[str, Any], Any]:
    store = IndexStore(index_dir)
    name = store.find(COLOUR)
    manifest = json.loads((index_dir / name / "manifest.json").read_text())
    return manifest, store.load(name)


def comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in manifest.items() if k not in _PER_BUILD}
    kept["files"] = {name: {"size": f["size"]} for name, f in manifest["files"].items()}
    # the score background is of those vectors too: its counts are compared, not its scores
    background = manifest["score_background"]
    kept["score_background"] = {k: background[k] for k in ("sample_rows", "pairs", "seed")}
    return kept


def onnx_exports(cache: Path) -> list[Path]:
    root = cache / CACHE_SUBDIR
    return [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []


def top_k(index_dir: Path, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    manifest, loaded = stored(index_dir)
    queries = vectorizer_for(loaded.manifest, runtime=Runtime(device="cpu")).encode(QUERIES, COLOUR)
    scores, rows = loaded.index.search(queries, k)
    return scores, np.asarray([[loaded.ids[i] for i in row] for row in rows])


@pytest.mark.numerics
@pytest.mark.parametrize("profile", ["none", "head", "adapter and head"])
def test_auto_runs_onnxruntime_and_builds_torchs_index(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    flags: list[object] = ["--head", "none"]
    spec = EncoderSpec(str(tiny_bert_dir), head="none", runtime=Runtime(device="cpu"))
    if profile != "none":
        torch.manual_seed(3)
        save_head(ProjectionHead(HeadConfig(input_dim=32, dim=16, model_id=str(tiny_bert_dir))), tmp_path / "head")
        flags = ["--head", tmp_path / "head"]
        spec = replace(spec, head=str(tmp_path / "head"))
    if profile == "adapter and head":
        flags += ["--adapter", _adapter(tiny_bert_dir, tmp_path / "adapter")]
        spec = replace(spec, adapter=str(tmp_path / "adapter"))
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(tmp_path / "cache"))
    by_torch = index(corpus_file, tmp_path / "torch", tiny_bert_dir, *flags, "--backend", "torch")
    assert by_torch["backend"] == "torch" and not onnx_exports(tmp_path / "cache")  # torch writes no export
    by_onnx = index(corpus_file, tmp_path / "auto", tiny_bert_dir, *flags)  # auto: the default
    assert by_onnx["backend"] == "onnxruntime" and len(onnx_exports(tmp_path / "cache")) == 1  # written first
    # the same manifest (model, encoder record, head, spec, fingerprint, sizes) apart from when it was built
    (m_torch, torch_index), (m_onnx, onnx_index) = stored(tmp_path / "torch"), stored(tmp_path / "auto")
    assert comparable(m_onnx) == comparable(m_torch)
    assert m_onnx["fingerprint"] == m_torch["fingerprint"] and m_onnx["spec"] == m_torch["spec"]
    assert ("adapter_checksum" in m_onnx["encoder"]) == (profile == "adapter and head")
    n = len(SENTENCES)
    vectors_onnx, vectors_torch = onnx_index.index.reconstruct_n(0, n), torch_index.index.reconstruct_n(0, n)
    # float32 rounding at the magnitudes each row's forward passes reach (the random adapter's are ~200),
    # magnified by the unit length where the CASE difference nearly cancels (the adapter's row 1 here)
    reference = load_bulk_vectorizer(spec, backend="torch")
    tolerance = vector_tolerance(reference, SENTENCES, COLOUR)
    assert list(torch_index.ids) == [f"s{i}" for i in range(n)]  # rows in the corpus's order
    assert_rows_close(vectors_onnx, vectors_torch, tolerance)
    # one query vector for both (the same manifest): an id's score moves by at most its vector's error's length
    by_id = dict(zip(torch_index.ids, tolerance * np.sqrt(vectors_torch.shape[1]), strict=True))
    assert_same_ranking(top_k(tmp_path / "auto"), top_k(tmp_path / "torch"), tol=by_id.__getitem__)


def test_an_index_built_on_torch_is_reused_by_onnxruntime_and_back(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    # one fingerprint: re-indexing on the other backend keeps every row
    index(corpus_file, tmp_path / "ix", tiny_bert_dir, "--head", "none", "--backend", "torch")
    again = index(corpus_file, tmp_path / "ix", tiny_bert_dir, "--head", "none")
    assert (again["backend"], again["encoded"], again["reused"]) == ("onnxruntime", 0, len(SENTENCES))
    back = index(corpus_file, tmp_path / "ix", tiny_bert_dir, "--head", "none", "--backend", "torch")
    assert (back["backend"], back["encoded"], back["reused"]) == ("torch", 0, len(SENTENCES))


def test_models_onnx_does_not_cover_index_through_torch(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    row = index(corpus_file, tmp_path / "mean", tiny_bert_dir, "--head", "none", "--pooling", "mean")
    assert row["backend"] == "torch" and row["rows"] == len(SENTENCES)
    assert stored(tmp_path / "mean")[0]["encoder"]["pooling"] == "mean"


def test_a_refused_export_indexes_through_torch(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnx_export, "probe_tolerance", lambda *_: -1.0)  # nothing agrees
    row = index(corpus_file, tmp_path / "ix", tiny_bert_dir, "--head", "none")
    assert row["backend"] == "torch" and row["rows"] == len(SENTENCES)


def test_bulk_onnxruntime_takes_every_core_or_threads(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.model.encoders.onnx.run as onnx_run

    opened, session = [], onnx_run.open_session
    monkeypatch.setattr(
        onnx_run, "open_session", lambda path, threads: opened.append(threads) or session(path, threads)
    )
    index(corpus_file, tmp_path / "a", tiny_bert_dir, "--head", "none")
    assert opened == [1, available_cores()]  # the export's check against torch runs on one; the encoder on all
    opened.clear()
    index(corpus_file, tmp_path / "b", tiny_bert_dir, "--head", "none", "--threads", "1")
    assert opened == [1]  # the export is cached: only the encoder's session, with the threads asked for


@pytest.mark.numerics
def test_the_onnxruntime_encoder_batches_by_length(tiny_bert_dir: Path) -> None:
    vec = load_bulk_vectorizer(EncoderSpec(str(tiny_bert_dir), head="none", runtime=Runtime(device="cpu")))
    assert backend_of(vec) == "onnxruntime" and isinstance(vec.encoder, OnnxBertEncoder)
    lengths: list[list[int]] = []
    run = vec.encoder.encode_batch
    count = vec.encoder.sort_lengths  # token counts, as encode_pairs sorts by
    vec.encoder.encode_batch = lambda pairs: lengths.append(count(pairs)) or run(pairs)  # type: ignore[method-assign]
    texts = ["short", SENTENCES[0], "a girl", SENTENCES[6], "a much longer sentence about a dog in the park"]
    out = vec.encode(texts, COLOUR, batch_size=2)
    flat = [n for batch in lengths[1:] for n in batch]  # after the condition's own vector
    assert flat == sorted(flat, reverse=True)  # longest first: little padding
    torch_vec = load_bulk_vectorizer(
        EncoderSpec(str(tiny_bert_dir), head="none", runtime=Runtime(device="cpu")), backend="torch"
    )
    assert backend_of(torch_vec) == "torch"
    tolerance = vector_tolerance(torch_vec, texts, COLOUR)
    assert_rows_close(out, torch_vec.encode(texts, COLOUR, batch_size=2), tolerance)  # order kept


def test_index_help_shows_the_backend() -> None:
    out = CliRunner().invoke(main, ["index", "--help"]).output
    assert "--backend [auto|torch]" in out
