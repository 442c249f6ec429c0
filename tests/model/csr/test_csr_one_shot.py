"""One-shot router queries without torch (issues 39, 41): the export's passes with the cached condition code.

A router index built on the CPU (``index --backend auto``) leaves the router's checked export and its
condition's code in the cache; a few queries of it then run on onnxruntime alone. The tiny BERT stands
in for MiniLM, with a trained-looking router (weights moved off their start, saved with a checksum).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.base.output_cache import default_cache_dir
from condsearch.cli import main
from condsearch.model.csr.cache import StateCache
from condsearch.model.csr.keys import CSR_FILES, KIND, LOWER_FILE, QUERIES_SUBDIR
from condsearch.model.csr.one_shot import OneShotRouterEncoder, round_as_stored
from condsearch.model.encoders.onnx.cache import META_FILE
from condsearch.model.one_shot import load_one_shot
from condsearch.model.policy import vectorizer_for
from condsearch.store.folder import IndexStore
from tests.cli.test_cli import assert_clean_error
from tests.conftest import assert_same_ranking
from tests.model.csr.test_csr_parity import QUERIES, ranking, run
from tests.serve.test_serve_cli import _modules_after
from tests.tolerance import assert_rows_close, routed_tolerance

CONDITION = "the sport being played"
K = 5
#: a query's states are rounded to int8 (context) or float16 (extended) as the state cache stores them; torch's
#: and onnxruntime's float32 states may round to neighbouring steps, which moves a score by far less than this
STORED_SCORE_TOL = 2e-3


def _move(encoder, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.router.trainable_parameters().values():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def save_moved_router(tiny_bert_dir: Path, variant: str, out: Path, seed: int = 0) -> Path:
    """Save a router for the tiny BERT (its top layer routed) whose weights are off their start."""
    from condsearch.model.csr import load_csr_encoder

    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", variant=variant, layer=-1, cache_dir=out / "cache")
    _move(encoder, seed)
    meta = {"model_id": encoder.model_id}
    if variant == "context":
        import transformers

        from condsearch.model.csr.context_weights import backbone_delta, save_context_router

        base = {n: p.detach() for n, p in transformers.AutoModel.from_pretrained(str(tiny_bert_dir)).named_parameters()}
        delta, rank = backbone_delta(base, encoder.router.model, dtype=torch.float32)
        save_context_router(encoder.router, delta, rank, out / "router", meta)  # type: ignore[arg-type]
    else:
        from condsearch.model.csr.weights import save_router

        save_router(encoder.router, out / "router", meta, dtype=torch.float32)  # type: ignore[arg-type]
    return out / "router"


@pytest.fixture(scope="module", params=["context", "extended"])
def router(request: pytest.FixtureRequest, tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_moved_router(tiny_bert_dir, request.param, tmp_path_factory.mktemp(f"router-{request.param}"))


def _index(corpus: Path, model: Path, router: Path, folder: Path, *flags: object) -> Path:
    run(
        "index",
        corpus,
        "-c",
        CONDITION,
        "--mode",
        "csr",
        "--router",
        router,
        "--model",
        model,
        "--index-dir",
        folder,
        *flags,
    )
    return folder


@pytest.fixture
def index_dir(tmp_path: Path, corpus_file: Path, tiny_bert_dir: Path, router: Path) -> Path:
    return _index(corpus_file, tiny_bert_dir, router, tmp_path / "idx")


def _manifest(index_dir: Path):
    store = IndexStore(index_dir)
    (name,) = store.names()
    return store.read_manifest(name)


def _answers(index_dir: Path, *queries: str) -> list[dict]:
    out = run("query", *(queries or QUERIES), "-c", CONDITION, "-k", K, "--json", "--index-dir", index_dir).stdout
    return [json.loads(line) for line in out.splitlines()]


def _light(index_dir: Path):
    return vectorizer_for(_manifest(index_dir), one_shot=True, one_condition=True)


def _export(precision: str = "float32") -> Path:
    for meta_file in (default_cache_dir() / "onnx").glob(f"*/{META_FILE}"):
        meta = json.loads(meta_file.read_text())
        if meta.get("kind") == KIND and meta.get("precision") == precision and meta.get("usable"):
            return meta_file.parent
    raise AssertionError(f"no usable {precision} router export")


def test_a_one_shot_router_query_loads_no_torch(index_dir: Path) -> None:
    argv = ["query", *QUERIES, "-c", CONDITION, "-k", str(K), "--json", "--index-dir", str(index_dir)]
    code = (
        "import contextlib, io\nfrom condsearch.cli import main\nout = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n    try:\n"
        f"        main({argv!r})\n    except SystemExit as exc:\n        assert not exc.code\n"
        "open('answers.jsonl', 'w').write(out.getvalue())"
    )
    modules = _modules_after(f"import os\nos.chdir({str(index_dir.parent)!r})\n{code}")
    assert "torch" not in modules and "transformers" not in modules
    light = [json.loads(line) for line in (index_dir.parent / "answers.jsonl").read_text().splitlines()]
    heavy = _answers(index_dir)  # in this process, where torch is loaded already: the same path, asked again
    assert [a["query"] for a in light] == QUERIES
    assert_same_ranking(ranking(light), ranking(heavy), STORED_SCORE_TOL)


def test_the_one_shot_path_is_taken_and_agrees_with_torch_and_the_server(index_dir: Path) -> None:
    from condsearch.model.encoders.spec import Runtime
    from condsearch.model.policy import load_index_model

    manifest = _manifest(index_dir)
    light = _light(index_dir)
    assert isinstance(light.encoder, OneShotRouterEncoder) and light.backend == "onnxruntime"
    assert light.encoder.describe() == manifest.encoder and light.mode == "csr"
    heavy = vectorizer_for(manifest)
    served = load_index_model(manifest, runtime=Runtime())
    assert served.encoder.backend == "onnxruntime" and heavy.encoder.backend == "torch"
    for query in QUERIES:  # one at a time: each pass sees the same shapes
        got = light.encode([query], CONDITION)
        assert_rows_close(got, served.encode([query], CONDITION), STORED_SCORE_TOL)
        assert_rows_close(got, heavy.encode([query], CONDITION), STORED_SCORE_TOL)


def test_an_index_built_in_bfloat16_is_answered_one_shot_in_float32(
    tmp_path: Path, corpus_file: Path, tiny_bert_dir: Path, router: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU kind that routes bulk work in bfloat16 still leaves the float32 export for one-shot queries."""
    from condsearch.base.cpu_kind import AUTO_DTYPE_KEY, CPU_KIND_ENV

    monkeypatch.setenv(CPU_KIND_ENV, "avx512")
    index_dir = _index(corpus_file, tiny_bert_dir, router, tmp_path / "idx")
    manifest = _manifest(index_dir)
    context = manifest.encoder["router_variant"] == "context"  # the variant measured in bfloat16
    assert manifest.encoder.get(AUTO_DTYPE_KEY) == ("bfloat16" if context else None)
    light = _light(index_dir)
    assert isinstance(light.encoder, OneShotRouterEncoder) and light.encoder.precision == "float32"
    assert AUTO_DTYPE_KEY not in light.encoder.describe()


def test_one_shot_arithmetic_equals_torch_on_the_same_states(index_dir: Path, tmp_path: Path) -> None:
    """Without the state cache's rounding (float32 states), the one-shot vectors are torch's up to float32 rounding."""
    manifest = _manifest(index_dir)
    light = _light(index_dir).encoder
    from condsearch.base.model_sources import resolve_model
    from condsearch.model.csr.encoder import CsrEncoder
    from condsearch.model.encoders.spec import EncoderSpec

    spec = EncoderSpec.of_manifest(manifest)
    heavy = CsrEncoder(
        resolve_model(spec.model),
        router=str(manifest.encoder["router"]),
        cache_dir=tmp_path / "cache",
        state_dtype=torch.float32,
    )
    heavy.condition_code(CONDITION)  # its code under the float32 states' name
    exact = OneShotRouterEncoder(
        replace(light.record, identity=replace(light.identity, state_dtype="float32")),
        light.tokenizer,
        light.sessions,
        tmp_path / "cache",
    )
    texts = [*QUERIES, "tennis"]
    tolerance = routed_tolerance(heavy, texts, CONDITION)
    assert_rows_close(exact.encode(texts, CONDITION, batch_size=3), heavy.encode(texts, CONDITION), tolerance)


@pytest.mark.parametrize("dtype", ["int8", "float16", "float32"])
def test_states_are_rounded_as_the_state_cache_stores_them(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(0)
    states = (rng.standard_normal((5, 32)) * rng.uniform(0.1, 4.0, (5, 1))).astype(np.float32)
    states[2] = 0.0  # a padding-like row
    cache = StateCache(tmp_path, dtype=getattr(torch, dtype), names=("x",))
    cache.put(["ab" * 32], [(torch.from_numpy(states),)])
    (stored,) = cache.get(["ab" * 32])
    np.testing.assert_array_equal(round_as_stored(states, dtype), stored[0].float().numpy())


def test_int8_indexes_use_their_int8_export(
    tmp_path: Path, corpus_file: Path, tiny_bert_dir: Path, router: Path
) -> None:
    index_dir = _index(corpus_file, tiny_bert_dir, router, tmp_path / "idx", "--quantize", "int8")
    manifest = _manifest(index_dir)
    light = _light(index_dir)
    assert isinstance(light.encoder, OneShotRouterEncoder) and light.encoder.precision == "int8"
    assert light.encoder.describe() == manifest.encoder
    heavy = vectorizer_for(manifest)
    assert heavy.encoder.precision == "int8"
    for query in QUERIES:
        assert_rows_close(light.encode([query], CONDITION), heavy.encode([query], CONDITION), STORED_SCORE_TOL)


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("what", ["no code", "damaged code", "no export", "damaged export"])
def test_a_missing_or_damaged_code_or_export_falls_back_to_torch(index_dir: Path, what: str) -> None:
    expected = _answers(index_dir)
    codes = default_cache_dir() / QUERIES_SUBDIR
    if what == "no code":
        shutil.rmtree(codes)
    elif what == "damaged code":
        for shard in codes.glob("shard-*.npz"):
            _damage(shard)
    elif what == "no export":
        shutil.rmtree(_export())
    else:
        _damage(_export() / (LOWER_FILE + ".data"))
    assert load_one_shot(_manifest(index_dir), condition=CONDITION) is None
    assert _light(index_dir).backend == "torch"
    assert_same_ranking(ranking(_answers(index_dir)), ranking(expected), STORED_SCORE_TOL)
    # that torch query cached what the next one needs again
    assert isinstance(_light(index_dir).encoder, OneShotRouterEncoder)
    assert set(json.loads((_export() / META_FILE).read_text())["files"]) == set(CSR_FILES)


def test_a_changed_router_is_never_served_stale(
    index_dir: Path, tiny_bert_dir: Path, router: Path, tmp_path: Path
) -> None:
    manifest = _manifest(index_dir)
    assert load_one_shot(manifest, condition=CONDITION) is not None
    variant = str(manifest.encoder["router_variant"])
    other = save_moved_router(tiny_bert_dir, variant, tmp_path / "other", seed=1)
    saved = tmp_path / "saved"
    shutil.copytree(router, saved)
    try:
        shutil.rmtree(router)
        shutil.copytree(other, router)  # the same folder, other weights (router.json records their checksum)
        assert load_one_shot(manifest, condition=CONDITION) is None
        argv = ["query", QUERIES[0], "-c", CONDITION, "--index-dir", str(index_dir)]
        result = CliRunner().invoke(main, argv)
        assert_clean_error(result, match="changed since; re-index")
    finally:
        shutil.rmtree(router)
        shutil.copytree(saved, router)


def test_a_one_shot_router_refuses_a_condition_whose_code_is_not_cached(index_dir: Path) -> None:
    from condsearch.errors import ModelError

    light = _light(index_dir)
    with pytest.raises(ModelError, match="not cached"):
        light.encode(["a girl"], "a condition never seen")
    assert load_one_shot(_manifest(index_dir)) is None  # without a condition (the server): torch


def test_the_query_cache_finds_one_code_without_reading_every_shard(tmp_path: Path, monkeypatch) -> None:
    from condsearch.base import output_cache as cache_module
    from condsearch.base.output_cache import EmbeddingCache

    writer = EmbeddingCache(tmp_path)
    keys = [f"{i:064x}" for i in range(4)]
    writer.put_many(keys[:1], np.ones((1, 3), dtype=np.float32))  # a code is put alone
    writer.put_many(keys[1:3], np.full((2, 3), 2.0, dtype=np.float32))  # several at once: found by get_many
    read: list[Path] = []
    real = cache_module._read_shard
    monkeypatch.setattr(cache_module, "_read_shard", lambda shard: read.append(shard) or real(shard))
    found = EmbeddingCache(tmp_path).get(keys[0])
    assert found is not None and found.tolist() == [1.0, 1.0, 1.0] and len(read) == 1
    read.clear()
    assert EmbeddingCache(tmp_path).get(keys[3]) is None and len(read) == 1  # a miss reads one shard, not every one
    assert EmbeddingCache(tmp_path).get(keys[2]) is None  # not put alone: get does not scan (issue 58)
    other = EmbeddingCache(tmp_path).get_many([keys[2]])[keys[2]]
    assert other.tolist() == [2.0, 2.0, 2.0]
    (alone,) = [p for p in tmp_path.glob("shard-*.npz") if p == EmbeddingCache(tmp_path)._shard(keys[:1])[0]]
    _damage(alone)
    assert EmbeddingCache(tmp_path).get(keys[0]) is None  # a damaged shard is a miss
