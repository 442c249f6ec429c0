"""The router on onnxruntime (issues 39, 41): float32 and int8 exports of its two passes, checked and cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from condsearch.errors import ModelError
from condsearch.model.csr import load_csr_encoder
from condsearch.model.csr import onnx as csr_onnx
from condsearch.model.csr.encoder import CsrEncoder
from condsearch.model.encoders.onnx.cache import META_FILE
from condsearch.model.encoders.onnx.export import pooled_cosines
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.policy import backend_of, load_bulk_vectorizer, load_index_model
from condsearch.store.manifest import Manifest, manifest_from_dict
from tests.benchmarks.test_benchmarks import load_script
from tests.cli.test_cli import assert_clean_error, ok, query, run
from tests.conftest import SENTENCES as CORPUS
from tests.tolerance import assert_rows_close, routed_tolerance

TEXTS = [
    "A girl in an orange dress serves the ball",
    "Two dogs run on the beach",
    "a man rides a red bike on the road past the park and the busy city street",
    "tennis",
]
COLOUR = "color of the dress"
ROWS = ["the sport", COLOUR, "mood", "the colour of the shirt and the hat"]
#: every variant, routing the top layer of the tiny 2-layer BERT (so that each pass has layers to run)
VARIANTS = ["context", "paper", "extended"]


def _encoder(folder: Path, cache: Path, variant: str = "context", **kwargs: object) -> CsrEncoder:
    kwargs.setdefault("state_dtype", torch.float32)
    return load_csr_encoder(str(folder), router="none", variant=variant, layer=-1, cache_dir=cache, **kwargs)


def _onnx(folder: Path, cache: Path, variant: str = "context", **kwargs: object) -> CsrEncoder:
    encoder = _encoder(folder, cache, variant, **kwargs)
    assert encoder.use_onnx("float32", threads=1) and encoder.backend == "onnxruntime"
    return encoder


@pytest.mark.numerics
@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_float32_agrees_with_torch(tiny_bert_dir: Path, tmp_path: Path, variant: str) -> None:
    """Both passes, under one condition and each row under its own: torch's vectors up to float32 rounding."""
    torch_encoder = _encoder(tiny_bert_dir, tmp_path / "torch", variant)
    light = _onnx(tiny_bert_dir, tmp_path / "onnx", variant)
    assert torch_encoder.backend == "torch" and light.precision == "float32"
    assert light.describe() == torch_encoder.describe()  # the same index either way
    tolerance = routed_tolerance(torch_encoder, TEXTS, COLOUR)
    assert_rows_close(light.encode(TEXTS, COLOUR, batch_size=3), torch_encoder.encode(TEXTS, COLOUR), tolerance)
    tolerance = routed_tolerance(torch_encoder, TEXTS, ROWS)
    assert_rows_close(light.encode(TEXTS, ROWS, batch_size=3), torch_encoder.encode(TEXTS, ROWS), tolerance)
    # the lower pass alone: the states the cache keeps
    inputs = dict(torch_encoder.tokenizer(TEXTS, padding=True, return_tensors="pt"))
    with torch.inference_mode():
        want = torch_encoder.router.sentence_states(inputs)
    got = light.runner.sentence_states(inputs)
    assert torch.equal(got.mask, want.mask)
    if variant == "context":  # x alone
        assert got.k is None and got.c is None and want.k is None
    pairs = [(got.x, want.x)] + ([] if variant == "context" else [(got.k, want.k), (got.c, want.c)])
    for a, b in pairs:
        assert a is not None and b is not None
        assert_rows_close(a[want.mask].numpy(), b[want.mask].numpy(), float(tolerance.max()))


@pytest.mark.numerics
def test_float32_states_are_shared_between_torch_and_onnx(tiny_bert_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """onnxruntime's float32 states are torch's up to rounding, so they share one cache; torch routes them alike."""
    light = _onnx(tiny_bert_dir, tmp_path)
    torch_encoder = _encoder(tiny_bert_dir, tmp_path)
    assert light.states.directory == torch_encoder.states.directory
    light.cache_sentences(TEXTS)
    fresh = _encoder(tiny_bert_dir, tmp_path / "fresh")
    expected = fresh.encode(TEXTS, COLOUR)
    monkeypatch.setattr(torch_encoder.router, "sentence_states", lambda inputs: pytest.fail("recomputed a state"))
    assert_rows_close(torch_encoder.encode(TEXTS, COLOUR), expected, routed_tolerance(fresh, TEXTS, COLOUR))


@pytest.mark.numerics
@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_is_close_to_float32_and_kept_apart(tiny_bert_dir: Path, tmp_path: Path, variant: str) -> None:
    exact = _encoder(tiny_bert_dir, tmp_path, variant)
    small = _encoder(tiny_bert_dir, tmp_path, variant, quantize="int8", threads=1)
    assert small.backend == "onnxruntime" and small.precision == "int8"
    # int8 states are computed otherwise: never read for float32, nor the reverse
    assert small.states.directory != exact.states.directory
    for rows in (COLOUR, ROWS):
        assert pooled_cosines(small.encode(TEXTS, rows), exact.encode(TEXTS, rows)).min() > 0.99
    described = small.describe()
    assert described["quantize"] == "int8" and str(described["quantize_runtime"]).startswith("onnxruntime ")
    assert "quantize" not in exact.describe()
    assert EncoderSpec.recorded(described, "csr", "none").quantize == "int8"
    assert EncoderSpec.recorded(exact.describe(), "csr", "none").quantize == "none"


def _export_folder(cache: Path) -> Path:
    (folder,) = [p for p in (cache / "onnx").iterdir() if not p.name.startswith(".")]
    return folder


def test_the_export_is_cached_checked_and_a_damaged_one_is_a_miss(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    expected = _onnx(tiny_bert_dir, tmp_path).encode(TEXTS, COLOUR)
    folder = _export_folder(tmp_path)
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["kind"] == csr_onnx.KIND and meta["usable"] is True and set(meta["files"]) == set(csr_onnx.CSR_FILES)
    exports: list[str] = []
    real = csr_onnx.export_router
    monkeypatch.setattr(csr_onnx, "export_router", lambda *a, **k: exports.append("x") or real(*a, **k))
    _onnx(tiny_bert_dir, tmp_path)  # read from the cache
    assert exports == []
    # the same size, other bytes: only the sha256 tells; the export is written again, never run damaged
    weights = folder / (csr_onnx.ROUTE_FILE + ".data")
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    weights.write_bytes(bytes(data))
    again = _onnx(tiny_bert_dir, tmp_path / "states")  # another state cache: the vectors are computed anew
    assert exports == ["x"]
    assert pooled_cosines(again.encode(TEXTS, COLOUR), expected).min() > 1 - 1e-6
    assert json.loads((_export_folder(tmp_path) / META_FILE).read_text())["usable"] is True


def test_other_weights_are_another_export(tiny_bert_dir: Path, other_bert_dir: Path, tmp_path: Path) -> None:
    a, b = _onnx(tiny_bert_dir, tmp_path), _onnx(other_bert_dir, tmp_path)
    assert csr_onnx.router_export_folder(a, "float32") != csr_onnx.router_export_folder(b, "float32")
    assert csr_onnx.router_export_folder(a, "float32") != csr_onnx.router_export_folder(a, "int8")
    # weights changed in memory (training) leave the export behind: torch runs them
    with torch.no_grad():
        next(a.router.parameters()).add_(0.1)
    a.refresh_identity()
    assert a.backend == "torch"


def test_a_refused_export_is_recorded_and_int8_says_so_in_one_line(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(csr_onnx, "disagreement", lambda encoder, runner: "cosine 0.100 < 0.9")
    kept = _encoder(tiny_bert_dir, tmp_path)
    assert not kept.use_onnx("float32", threads=1) and kept.backend == "torch"
    with pytest.raises(ModelError, match=r"^.*: the router's int8 outputs stray from float32 \(cosine 0.100 < 0.9\)$"):
        _encoder(tiny_bert_dir, tmp_path, quantize="int8", threads=1)
    # the refusal is cached: not exported again
    monkeypatch.setattr(csr_onnx, "export_router", lambda *a, **k: pytest.fail("exported a refused router again"))
    assert not _encoder(tiny_bert_dir, tmp_path).use_onnx("float32", threads=1)


def test_int8_refuses_a_gpu(tiny_bert_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("condsearch.model.csr.encoder.pick_device", lambda device: torch.device("meta"))
    with pytest.raises(ModelError, match="--quantize int8 runs on the CPU"):
        _encoder(tiny_bert_dir, tmp_path, quantize="int8")


def _csr_index(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path, *extra: object) -> dict:
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--mode", "csr", "--router", "none"]
    common += ["--router-variant", "context", "--router-layer", "-1", "--threads", "1", "--json"]
    result = ok(run("index", corpus_file, *common, *extra, "--index-dir", index_dir))
    return json.loads(result.stdout.splitlines()[-1])


def test_csr_index_on_each_path_and_its_queries(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    light = _csr_index(tiny_bert_dir, corpus_file, tmp_path / "auto")
    heavy = _csr_index(tiny_bert_dir, corpus_file, tmp_path / "torch", "--backend", "torch")
    small = _csr_index(tiny_bert_dir, corpus_file, tmp_path / "int8", "--quantize", "int8")
    assert (light["backend"], heavy["backend"], small["backend"]) == ("onnxruntime", "torch", "onnxruntime")
    assert (light["precision"], heavy["precision"], small["precision"]) == ("float32", "float32", "int8")
    manifests = {
        n: json.loads(next((tmp_path / n).glob("*/manifest.json")).read_text()) for n in ("auto", "torch", "int8")
    }
    # the float32 paths record one and the same encoder; int8 records itself, in the spec too
    assert (
        manifests["auto"]["encoder"] == manifests["torch"]["encoder"] and "quantize" not in manifests["auto"]["encoder"]
    )
    assert manifests["int8"]["encoder"]["quantize"] == "int8" and manifests["int8"]["spec"]["quantize"] == "int8"
    for name in ("auto", "torch", "int8"):
        hits = json.loads(ok(query(tmp_path / name, CORPUS[0], "-c", COLOUR, "-k", 1, "--json")).stdout)
        assert hits["results"][0]["text"] == CORPUS[0] and hits["results"][0]["score"] > 0.99
    ok(query(tmp_path / "int8", CORPUS[0], "-c", COLOUR, "--quantize", "int8"))
    message = assert_clean_error(query(tmp_path / "int8", CORPUS[0], "-c", COLOUR, "--quantize", "none"))
    assert "--quantize int8, not none" in message
    message = assert_clean_error(query(tmp_path / "torch", CORPUS[0], "-c", COLOUR, "--quantize", "int8"))
    assert "--quantize none, not int8" in message


def _manifest(index_dir: Path) -> Manifest:
    path = next(index_dir.glob("*/manifest.json"))
    return manifest_from_dict(json.loads(path.read_text()), path)


def test_the_server_runs_each_index_as_built(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    _csr_index(tiny_bert_dir, corpus_file, tmp_path / "float32")
    _csr_index(tiny_bert_dir, corpus_file, tmp_path / "int8", "--quantize", "int8")
    runtime = Runtime(device="cpu", threads=1)
    served = {}
    for name in ("float32", "int8"):
        manifest = _manifest(tmp_path / name)
        served[name] = load_index_model(manifest, runtime=runtime)
        assert backend_of(served[name]) == "onnxruntime"
        assert served[name].encoder.describe() == manifest.encoder
    assert served["int8"].encoder.precision == "int8" and served["float32"].encoder.precision == "float32"
    manifest = _manifest(tmp_path / "float32")
    assert backend_of(load_index_model(manifest, backend="torch", runtime=runtime)) == "torch"


def test_bulk_routes_on_onnx_only_where_it_measured_faster(tiny_bert_dir: Path, monkeypatch) -> None:
    runtime = Runtime(device="cpu", threads=1)
    spec = EncoderSpec(str(tiny_bert_dir), mode="csr", router="none", router_variant="paper", runtime=runtime)
    assert "paper" in csr_onnx.FASTER_ON_ONNX
    assert backend_of(load_bulk_vectorizer(spec)) == "onnxruntime"
    assert backend_of(load_bulk_vectorizer(spec, backend="torch")) == "torch"
    monkeypatch.setattr(csr_onnx, "FASTER_ON_ONNX", frozenset())
    assert backend_of(load_bulk_vectorizer(spec)) == "torch"


def test_csr_paths_benchmark_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--router", "none", "--variant", "context", "--n-texts", "8"]
    argv += ["--threads", "1"]  # the context variant: the one with a bfloat16 path
    assert load_script("csr_paths").main([*argv, "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["paths"]) == list(load_script("csr_paths").PATHS)
    for row in result["paths"].values():
        assert row["new_sentence_pairs_per_s"] > 0 and row["new_condition_pairs_per_s"] > 0
        assert len(row["seconds"]["new_sentence"]) == result["repeats"] == 2
        assert -1 <= row["dev_spearman"] <= 100 and row["cosine_to_torch"]["min"] > 0.9
    assert result["run"]["machine"]["cpu"] and len(result["load_average_start"]) == 3
