"""The torch-free one-shot query: the float32 ONNX export and the numpy head give torch's vectors, and
only for the model, adapter and head an index was built with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.base.model_sources import resolve_model
from condsearch.base.output_cache import default_cache_dir
from condsearch.cli import main
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.onnx import export as onnx_export
from condsearch.model.encoders.onnx.bert import (
    MODEL_FILE,
    WEIGHTS_FILE,
    OnnxBertEncoder,
    cached_refusal,
    export_folder,
    load_cached_export,
    write_export,
)
from condsearch.model.encoders.onnx.cache import CACHE_SUBDIR, META_FILE
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.head import HeadConfig, ProjectionHead, save_head
from condsearch.model.head_files import load_numpy_head
from condsearch.model.one_shot import cache_onnx_export, load_one_shot
from condsearch.model.policy import vectorizer_for
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, assert_same_ranking
from tests.model.encoders.test_onnx_trace import _adapter
from tests.tolerance import assert_rows_close, case_tolerance, float32_tolerance, vector_tolerance

COLOUR = "color of the dress"


def _exports() -> list[Path]:
    root = default_cache_dir() / CACHE_SUBDIR
    return [p for p in root.glob("*") if not p.name.startswith(".")] if root.is_dir() else []


@pytest.mark.numerics
@pytest.mark.parametrize("with_adapter", [False, True])
def test_float32_export_equals_the_torch_encoder(tiny_bert_dir: Path, tmp_path: Path, with_adapter: bool) -> None:
    adapter = _adapter(tiny_bert_dir, tmp_path / "ad") if with_adapter else None
    source = resolve_model(str(tiny_bert_dir))
    assert load_cached_export(source, "float32", max_length=None, adapter=adapter, threads=1) is None  # none yet
    reference = load_encoder(EncoderSpec(str(tiny_bert_dir), adapter=adapter, runtime=Runtime(device="cpu")))
    folder = export_folder(source, adapter, "float32")
    assert folder is not None
    written, refused = write_export(reference, source, folder, "float32", max_length=None, threads=1)
    assert refused is None and written is not None
    assert json.loads((folder / META_FILE).read_text())["usable"] is True
    light = load_cached_export(source, "float32", max_length=None, adapter=adapter, threads=1)
    assert isinstance(light, OnnxBertEncoder) and light.describe() == reference.describe()
    want, tolerance = reference.encode(SENTENCES, COLOUR), case_tolerance(reference, SENTENCES, COLOUR)
    assert_rows_close(light.encode(SENTENCES, COLOUR), want, tolerance)
    assert_rows_close(light.encode(SENTENCES[:1], COLOUR), want[:1], tolerance[:1])
    long = ["tennis " * 200]  # truncated alike, and reported
    assert_rows_close(
        light.encode(long, COLOUR), reference.encode(long, COLOUR), case_tolerance(reference, long, COLOUR)
    )
    assert light.report_truncation() is not None
    short = load_cached_export(source, "float32", max_length=12, adapter=adapter, threads=1)
    assert short is not None and short.max_length == 12
    # the int8 export of the same model is another folder
    assert export_folder(source, adapter, "int8") != folder


def test_a_refused_export_is_recorded_and_not_used(tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = resolve_model(str(tiny_bert_dir))
    reference = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    folder = export_folder(source, None, "float32")
    monkeypatch.setattr(onnx_export, "probe_tolerance", lambda *_: -1.0)  # nothing agrees
    written, refused = write_export(reference, source, folder, "float32", max_length=None, threads=1)
    assert written is None and refused is not None and "max difference" in refused
    assert folder is not None and cached_refusal(folder) == refused and not (folder / MODEL_FILE).exists()
    assert not (folder / WEIGHTS_FILE).exists()
    assert load_cached_export(source, "float32", max_length=None, adapter=None, threads=1) is None


@pytest.mark.numerics
def test_numpy_head_equals_the_torch_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = ProjectionHead(HeadConfig(input_dim=32, dim=8))
    save_head(head, tmp_path / "head")
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    light = load_numpy_head(tmp_path / "head")
    assert light.config == head.config
    # one matrix product of input_dim terms at the magnitude of its largest term
    terms = np.abs(x) @ np.abs(head.linear.weight.detach().numpy()).T
    assert_rows_close(light.project(x), head.project(x), float32_tolerance(terms, depth=x.shape[1]))


def _index(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path, head: str) -> None:
    # through torch, which writes no export: what a first query does without one is tested here
    args = ["index", str(corpus_file), "-c", COLOUR, "--model", str(tiny_bert_dir), "--head", head]
    args += ["--backend", "torch"]
    result = CliRunner().invoke(main, [*args, "--index-dir", str(index_dir)])
    assert result.exit_code == 0, result.output


@pytest.mark.numerics
def test_onnx_vectorizer_only_for_the_index_own_model_and_head(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    torch.manual_seed(1)
    head_dir = tmp_path / "head"
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=16, model_id=str(tiny_bert_dir))), head_dir)
    index_dir = tmp_path / "indexes"
    _index(tiny_bert_dir, corpus_file, index_dir, str(head_dir))
    store = IndexStore(index_dir)
    manifest = store.read_manifest(store.find(COLOUR))
    reference = vectorizer_for(manifest, runtime=Runtime(device="cpu"))  # the torch path
    assert load_one_shot(manifest) is None  # no export yet
    cache_onnx_export(manifest, reference)
    light = load_one_shot(manifest)
    assert light is not None and isinstance(light.encoder, OnnxBertEncoder)
    assert (light.profile_name, light.head_checksum, light.dim) == (manifest.head, manifest.head_checksum, 16)
    tolerance = vector_tolerance(reference, SENTENCES, COLOUR)
    assert_rows_close(light.encode(SENTENCES, COLOUR), reference.encode(SENTENCES, COLOUR), tolerance)
    # a head changed since indexing: not this path (vectorizer_for says why the index cannot be used)
    torch.manual_seed(2)
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=16, model_id=str(tiny_bert_dir))), head_dir)
    assert load_one_shot(manifest) is None


@pytest.mark.numerics
def test_a_repeated_one_shot_query_imports_no_torch_and_answers_alike(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    index_dir = str(tmp_path / "indexes")
    _index(tiny_bert_dir, corpus_file, Path(index_dir), "none")
    argv = ["query", SENTENCES[2], SENTENCES[5], "-c", COLOUR, "-k", "3", "--json", "--index-dir", index_dir]
    assert not _exports()
    # the first query goes through torch, then writes and checks the export
    with_torch = CliRunner().invoke(main, argv)
    assert with_torch.exit_code == 0, with_torch.output
    (folder,) = _exports()
    assert json.loads((folder / META_FILE).read_text())["usable"] is True
    code = (
        "import sys\nfrom condsearch.cli import main\ntry:\n"
        f"    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code\n"
        "loaded = {'torch', 'transformers'} & set(sys.modules)\nassert not loaded, loaded"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    want = [json.loads(line) for line in with_torch.stdout.splitlines()]
    got = [json.loads(line) for line in out.stdout.splitlines()]
    # the index is one; the query vectors differ by float32 rounding, and a score by at most that error's length
    store = IndexStore(Path(index_dir))
    reference = vectorizer_for(store.read_manifest(store.find(COLOUR)), runtime=Runtime(device="cpu"))
    queries = [SENTENCES[2], SENTENCES[5]]
    tolerance = vector_tolerance(reference, queries, COLOUR) * np.sqrt(reference.dim)
    assert len(got) == len(want) == len(queries)
    for a, b, tol in zip(got, want, tolerance, strict=True):
        answers = [
            (np.asarray([[h["score"] for h in r["results"]]]), np.asarray([[h["id"] for h in r["results"]]]))
            for r in (a, b)
        ]
        assert_same_ranking(answers[0], answers[1], tol=float(tol))


@pytest.mark.numerics
def test_an_int8_index_one_shot_query_runs_its_int8_export(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    index_dir = tmp_path / "indexes"
    args = ["index", str(corpus_file), "-c", COLOUR, "--model", str(tiny_bert_dir), "--quantize", "int8"]
    result = CliRunner().invoke(main, [*args, "--index-dir", str(index_dir)])  # writes the int8 export
    assert result.exit_code == 0, result.output
    store = IndexStore(index_dir)
    manifest = store.read_manifest(store.find(COLOUR))
    light = load_one_shot(manifest)
    assert light is not None and isinstance(light.encoder, OnnxBertEncoder) and light.encoder.precision == "int8"
    want = vectorizer_for(manifest).encode(SENTENCES, COLOUR)
    np.testing.assert_allclose(light.encode(SENTENCES, COLOUR), want, rtol=1e-5, atol=1e-5)


def test_query_threads_reach_the_one_shot_onnx_session(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.model.encoders.onnx.run as onnx_run

    index_dir = str(tmp_path / "indexes")
    _index(tiny_bert_dir, corpus_file, Path(index_dir), "none")
    argv = ["query", SENTENCES[2], "-c", COLOUR, "--json", "--index-dir", index_dir]
    assert CliRunner().invoke(main, argv).exit_code == 0  # through torch; writes the export
    opened, session = [], onnx_run.open_session
    monkeypatch.setattr(
        onnx_run, "open_session", lambda path, threads: opened.append(threads) or session(path, threads)
    )
    for extra, want in (([], 1), (["--threads", "2"], 2)):
        opened.clear()
        result = CliRunner().invoke(main, [*argv, *extra])
        assert result.exit_code == 0, result.output
        assert opened == [want]  # answered by onnxruntime, with the threads asked for
