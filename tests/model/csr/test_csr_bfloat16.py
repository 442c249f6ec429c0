"""The context router's passes in bfloat16 (issue 42): close to float32, sharing its caches, and taken by
``--backend auto`` for bulk work on the CPU kinds whose measured path says so, never for serving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY, CPU_KIND_ENV
from condsearch.model.csr import load_csr_encoder
from condsearch.model.csr.encoder import CsrEncoder
from condsearch.model.encoders.onnx.export import pooled_cosines
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.policy import backend_of, load_bulk_vectorizer, load_index_model
from condsearch.store.vectors import vector_fingerprint
from tests.cli.test_cli import ok, query, run
from tests.conftest import SENTENCES as CORPUS
from tests.model.csr.test_csr_onnx import COLOUR, ROWS, TEXTS, _manifest

#: bfloat16 keeps 8 bits of mantissa: a routed vector's cosine to float32's stays near 1, as measured on MiniLM
#: (>= 0.9998, benchmarks/systems/results/csr_paths_bf16_amd.json); the tiny random model gets a looser bound
MIN_COSINE = 0.99


def _encoder(folder: Path, cache: Path, variant: str = "context", **kwargs: object) -> CsrEncoder:
    return load_csr_encoder(str(folder), router="none", variant=variant, layer=-1, cache_dir=cache, **kwargs)


@pytest.mark.numerics
def test_bfloat16_routes_close_to_float32_on_the_same_cached_states(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = _encoder(tiny_bert_dir, tmp_path)
    half = _encoder(tiny_bert_dir, tmp_path)
    assert half.use_bfloat16() and (half.backend, half.precision) == ("torch", "bfloat16")
    for rows in (COLOUR, ROWS):
        assert pooled_cosines(half.encode(TEXTS, rows, batch_size=3), exact.encode(TEXTS, rows)).min() > MIN_COSINE
    # one state cache: the float32 states above are read, not computed again in bfloat16
    assert half.states.directory == exact.states.directory
    monkeypatch.setattr(half.router, "sentence_states", lambda inputs: pytest.fail("recomputed a state"))
    half.encode(TEXTS, "the mood")
    # a condition's code is float32 on every path, so the query cache is shared too
    assert half.identity == exact.identity
    assert torch.equal(half.condition_code(COLOUR).h, exact.condition_code(COLOUR).h)


def test_bfloat16_is_recorded_apart_from_the_fingerprint(tiny_bert_dir: Path, tmp_path: Path) -> None:
    exact, half = _encoder(tiny_bert_dir, tmp_path), _encoder(tiny_bert_dir, tmp_path)
    half.use_bfloat16()
    assert half.describe()[AUTO_DTYPE_KEY] == "bfloat16" and AUTO_DTYPE_KEY not in exact.describe()
    assert {k: v for k, v in half.describe().items() if k != AUTO_DTYPE_KEY} == exact.describe()

    def fingerprint(encoder: CsrEncoder) -> str:
        return vector_fingerprint(encoder.describe(), mode="csr", head_checksum="", dim=encoder.dim)

    assert fingerprint(half) == fingerprint(exact)


def test_only_the_measured_variant_and_float32_take_bfloat16(tiny_bert_dir: Path, tmp_path: Path) -> None:
    paper = _encoder(tiny_bert_dir, tmp_path, "paper")
    assert not paper.use_bfloat16() and paper.precision == "float32"
    small = _encoder(tiny_bert_dir, tmp_path, quantize="int8", threads=1)
    assert not small.use_bfloat16() and small.precision == "int8"
    # weights changed in place (training) go back to torch float32, as they leave an export behind
    half = _encoder(tiny_bert_dir, tmp_path)
    half.use_bfloat16()
    with torch.no_grad():
        next(half.router.parameters()).add_(0.1)
    half.refresh_identity()
    assert half.precision == "float32"


@pytest.mark.parametrize(("kind", "bulk"), [("avx512", "bfloat16"), ("amx", "bfloat16"), ("other", "float32")])
def test_bulk_work_follows_the_kind_and_serving_keeps_the_export(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch, kind: str, bulk: str
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, kind)
    runtime = Runtime(device="cpu", threads=1)
    spec = EncoderSpec(
        str(tiny_bert_dir), mode="csr", router="none", router_variant="context", router_layer=-1, runtime=runtime
    )
    vec = load_bulk_vectorizer(spec)
    assert vec.encoder.precision == bulk  # type: ignore[attr-defined]
    assert backend_of(vec) == ("torch" if bulk == "bfloat16" else "onnxruntime")
    assert backend_of(load_bulk_vectorizer(spec, backend="torch")) == "torch"  # asked for: torch float32
    assert load_bulk_vectorizer(spec, backend="torch").encoder.precision == "float32"  # type: ignore[attr-defined]


def _csr_index(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path) -> dict:
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--mode", "csr", "--router", "none"]
    common += ["--router-variant", "context", "--router-layer", "-1", "--threads", "1", "--json"]
    result = ok(run("index", corpus_file, *common, "--index-dir", index_dir))
    return json.loads(result.stdout.splitlines()[-1])


def test_an_index_built_in_bfloat16_is_served_and_reindexed_in_float32(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "avx512")
    built = _csr_index(tiny_bert_dir, corpus_file, tmp_path / "ix")
    assert (built["backend"], built["precision"]) == ("torch", "bfloat16")
    manifest = _manifest(tmp_path / "ix")
    assert manifest.encoder[AUTO_DTYPE_KEY] == "bfloat16" and manifest.precision == "bfloat16"
    # the server routes queries on the float32 export, and answers the index as built
    served = load_index_model(manifest, runtime=Runtime(device="cpu", threads=1))
    assert backend_of(served) == "onnxruntime" and served.encoder.precision == "float32"  # type: ignore[attr-defined]
    # the build left the float32 export cached: a one-shot query finds the row itself on top
    hits = json.loads(ok(query(tmp_path / "ix", CORPUS[0], "-c", COLOUR, "-k", 1, "--json")).stdout)
    assert hits["results"][0]["text"] == CORPUS[0] and hits["results"][0]["score"] > 0.99
    # another kind re-indexes in float32: one fingerprint, but the bfloat16 rows are encoded again (from the
    # cached sentence states), so that the manifest's float32 is what every vector is (issue 58, item 10)
    monkeypatch.setenv(CPU_KIND_ENV, "other")
    again = _csr_index(tiny_bert_dir, corpus_file, tmp_path / "ix")
    assert (again["backend"], again["encoded"], again["reused"]) == ("onnxruntime", len(CORPUS), 0)
    assert again["precision"] == "float32" and _manifest(tmp_path / "ix").precision == "float32"


def test_the_python_api_routes_as_index_does(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condsearch.api import load_model
    from tests.model.csr.test_csr_context import _save

    folder = tmp_path / "router"  # a context router folder (load_model names no variant)
    _save(_encoder(tiny_bert_dir, tmp_path / "cache"), tiny_bert_dir, folder)
    for kind, precision in (("avx512", "bfloat16"), ("other", "float32")):
        monkeypatch.setenv(CPU_KIND_ENV, kind)
        model = load_model(str(tiny_bert_dir), mode="csr", router=folder, device="cpu", threads=1)
        assert model.vectorizer.encoder.precision == precision  # type: ignore[attr-defined]
