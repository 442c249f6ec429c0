"""The CPU's kind and the measured path ``auto`` takes on it: bfloat16 where the CPU has it in hardware,
float32 elsewhere, and a serving path of its own; and indexes built on one path answered on another
(tests pin the kind: ``CONDSEARCH_CPU_KIND``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.base import cpu_kind as kinds
from condsearch.base.cpu_kind import AUTO_DTYPE_KEY, CPU_KIND_ENV, PATHS, cpu_kind, kind_of_flags, read_flags
from condsearch.cli import main
from condsearch.errors import ModelError
from condsearch.model.encoders.bert import BertStyleEncoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.policy import backend_of, load_bulk_vectorizer, load_index_model, vectorizer_for
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, assert_same_ranking
from tests.tolerance import EPS32, vector_tolerance

COLOUR = "color of the dress"
QUERIES = [SENTENCES[2], SENTENCES[5], "a girl in a red shirt plays tennis"]
#: a 2-core Sapphire Rapids Xeon's and a Zen 4 EPYC's flags, cut to those that matter and a few others
XEON_AMX = "fpu sse2 avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
EPYC = "fpu sse2 avx2 fma avx512f avx512bw avx512_vnni avx_vnni avx512_bf16"
#: the same Xeon as a host that hides AMX shows it: AVX-512 BF16 and FP16 (Intel's), no AMX flags
XEON_AMX_HIDDEN = "fpu sse2 avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16"
#: bfloat16 keeps 8 bits of mantissa where float32 keeps 24: its rounding, in float32's units
BF16_OVER_F32 = float(torch.finfo(torch.bfloat16).eps) / EPS32


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (XEON_AMX, "amx"),
        (EPYC, "avx512"),
        (XEON_AMX_HIDDEN, "avx512_fp16"),
        (XEON_AMX_HIDDEN + " amx_tile amx_bf16", "amx"),
        ("fpu sse2 avx2 fma", "other"),
        ("avx512f avx512_bf16 amx_tile", "avx512"),  # tiles without bfloat16 products are no AMX path
        ("", "other"),
    ],
)
def test_kind_of_flags(flags: str, kind: str) -> None:
    assert kind_of_flags(flags.split()) == kind


def test_read_flags_reads_the_first_cpus_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Xeon\nflags\t\t: {XEON_AMX}\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert kind_of_flags(read_flags(info)) == "amx"
    assert read_flags(tmp_path / "absent") == frozenset()


def test_the_table_indexes_in_bfloat16_where_the_cpu_has_it_and_never_int8() -> None:
    for kind in ("amx", "avx512"):  # bfloat16 products in hardware: AMX tiles, AVX-512 BF16 dot products
        assert (PATHS[kind].case_runner, PATHS[kind].case_dtype) == ("torch", "bfloat16")
    # an Intel Xeon whose AMX is hidden runs bfloat16 slower than float32 (issue 61): float32 on the export there
    for kind in ("avx512_fp16", "other"):
        assert (PATHS[kind].case_runner, PATHS[kind].case_dtype) == ("onnxruntime", "float32")
    # serving's small batches: onnxruntime, measured faster, on every kind, as a one-shot query answers (issue 58)
    assert [PATHS[k].serve_runner for k in kinds.CPU_KINDS] == ["onnxruntime"] * len(kinds.CPU_KINDS)
    # the context router's bulk passes: bfloat16 where it measured faster (AMX, the AMD's AVX-512 BF16)
    assert [PATHS[k].router_dtype for k in kinds.CPU_KINDS] == ["bfloat16", "bfloat16", "float32", "float32"]
    for path in PATHS.values():
        assert path.provenance and "int8" not in (path.case_dtype, path.router_dtype)


def test_the_kind_is_forced_by_the_environment_and_a_bad_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    assert cpu_kind() == "amx" and kinds.auto_case_dtype() == "bfloat16" and kinds.auto_case_runner() == "torch"
    monkeypatch.setenv(CPU_KIND_ENV, "avx512")
    assert kinds.auto_case_runner() == "torch" and kinds.auto_case_runner(serving=True) == "onnxruntime"
    monkeypatch.setenv(CPU_KIND_ENV, "avx512_fp16")
    assert kinds.auto_case_dtype() == "float32" and kinds.auto_router_dtype() == "float32"
    monkeypatch.setenv(CPU_KIND_ENV, "other")
    assert kinds.auto_case_dtype() == "float32" and kinds.auto_case_runner() == "onnxruntime"
    monkeypatch.setenv(CPU_KIND_ENV, "sapphire")
    with pytest.raises(ModelError, match="CONDSEARCH_CPU_KIND='sapphire' is no CPU kind"):
        cpu_kind()


def test_a_bad_kind_is_one_line_in_the_cli(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "sapphire")
    result = CliRunner().invoke(main, [*_index_argv(corpus_file, tmp_path / "ix", tiny_bert_dir)])
    assert result.exit_code == 1 and "is no CPU kind" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "ix").exists() or not any((tmp_path / "ix").iterdir())


def test_auto_is_bfloat16_where_the_cpu_has_it_and_float32_elsewhere_an_asked_dtype_is_kept(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condsearch.model.encoders import load_encoder

    for kind, auto in (("amx", torch.bfloat16), ("avx512", torch.bfloat16), ("other", torch.float32)):
        monkeypatch.setenv(CPU_KIND_ENV, kind)
        encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
        assert isinstance(encoder, BertStyleEncoder) and encoder.dtype == auto
        # the record names a dtype auto chose apart from an asked one; float32 records nothing, as before
        assert encoder.describe().get(AUTO_DTYPE_KEY) == ("bfloat16" if auto == torch.bfloat16 else None)
        assert "dtype" not in encoder.describe()
        asked = load_encoder(EncoderSpec(str(tiny_bert_dir), dtype="float32", runtime=Runtime(device="cpu")))
        assert isinstance(asked, BertStyleEncoder) and asked.dtype == torch.float32
    # an export's twin and fine-tuning ask for float32 (None): never the CPU's choice
    assert BertStyleEncoder(_source(tiny_bert_dir), device="cpu").dtype == torch.float32


def _source(folder: Path) -> Any:
    from condsearch.base.model_sources import resolve_model

    return resolve_model(str(folder))


def _index_argv(corpus: Path, index_dir: Path, model: Path, *extra: object) -> list[str]:
    argv = ["index", corpus, "-c", COLOUR, "--model", model, "--head", "none", "--device", "cpu"]
    return [str(a) for a in [*argv, "--json", "--index-dir", index_dir, *extra]]


def _index(corpus: Path, index_dir: Path, model: Path, *extra: object) -> dict[str, Any]:
    result = CliRunner().invoke(main, _index_argv(corpus, index_dir, model, *extra))
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    [row] = [json.loads(line) for line in result.stdout.splitlines()]
    return row


def _top_k(index_dir: Path, vec: Any, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    store = IndexStore(index_dir)
    loaded = store.load(store.find(COLOUR))
    scores, rows = loaded.index.search(vec.encode(QUERIES, COLOUR), k)
    return scores, np.asarray([[loaded.ids[i] for i in row] for row in rows])


def _manifest(index_dir: Path) -> Any:
    store = IndexStore(index_dir)
    return store.load(store.find(COLOUR)).manifest


@pytest.mark.numerics
def test_index_on_amx_runs_torch_bfloat16_records_it_and_float32_answers_it(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    on_amx = _index(corpus_file, tmp_path / "amx", tiny_bert_dir)
    assert (on_amx["backend"], on_amx["encoded"]) == ("torch", len(SENTENCES))
    built = _manifest(tmp_path / "amx")
    assert built.encoder[AUTO_DTYPE_KEY] == "bfloat16" and built.spec["dtype"] == "auto"  # what ran; what was asked
    # the server on AMX answers on the float32 export, as a one-shot query does (issue 58); torch reads in bfloat16
    assert backend_of(load_index_model(built, runtime=Runtime(device="cpu"))) == "onnxruntime"
    served = vectorizer_for(built, runtime=Runtime(device="cpu"))
    assert served.encoder.dtype == torch.bfloat16  # type: ignore[attr-defined]

    monkeypatch.setenv(CPU_KIND_ENV, "avx512")  # indexes and serves as AMX does
    assert _index(corpus_file, tmp_path / "avx512", tiny_bert_dir)["backend"] == "torch"
    assert _manifest(tmp_path / "avx512").encoder[AUTO_DTYPE_KEY] == "bfloat16"
    assert backend_of(load_index_model(built, runtime=Runtime(device="cpu"))) == "onnxruntime"

    monkeypatch.setenv(CPU_KIND_ENV, "other")
    on_avx = _index(corpus_file, tmp_path / "avx", tiny_bert_dir)
    assert on_avx["backend"] == "onnxruntime"
    float32_built = _manifest(tmp_path / "avx")
    assert AUTO_DTYPE_KEY not in float32_built.encoder and float32_built.spec == built.spec
    # one fingerprint: vectors built on either kind are kept by the other (within the bound of docs/indexing.md)
    assert float32_built.fingerprint == built.fingerprint

    # another kind answers the bfloat16 index in float32, on torch and on onnxruntime, without refusal
    float32 = vectorizer_for(built, runtime=Runtime(device="cpu"))
    assert float32.encoder.dtype == torch.float32  # type: ignore[attr-defined]
    light = load_index_model(built, runtime=Runtime(device="cpu"))
    assert backend_of(light) == "onnxruntime"
    # a score moves by the query's and the row's errors: float32's rounding bound, in bfloat16's units
    tolerance = vector_tolerance(float32, [*SENTENCES, *QUERIES], COLOUR) * BF16_OVER_F32
    bound = 2 * float(tolerance.max()) * np.sqrt(float32.encoder.dim)
    reference = _top_k(tmp_path / "avx", float32)
    assert_same_ranking(_top_k(tmp_path / "amx", float32), reference, tol=bound)
    assert_same_ranking(_top_k(tmp_path / "amx", light), reference, tol=bound)
    assert_same_ranking(_top_k(tmp_path / "avx", served), reference, tol=bound)  # and AMX's torch answers float32's


def test_reindexing_on_another_kind_encodes_again_in_its_precision(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 58: keeping the bfloat16 vectors recorded float32 (tests/ingest/test_precision_record.py)
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    _index(corpus_file, tmp_path / "ix", tiny_bert_dir)
    monkeypatch.setenv(CPU_KIND_ENV, "other")
    again = _index(corpus_file, tmp_path / "ix", tiny_bert_dir)
    assert (again["backend"], again["encoded"], again["reused"]) == ("onnxruntime", len(SENTENCES), 0)
    assert again["precision"] == "float32"


def test_bulk_loading_elsewhere_is_unchanged(tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "other")
    vec = load_bulk_vectorizer(EncoderSpec(str(tiny_bert_dir), head="none", runtime=Runtime(device="cpu")))
    assert backend_of(vec) == "onnxruntime" and AUTO_DTYPE_KEY not in vec.encoder.describe()
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    vec = load_bulk_vectorizer(EncoderSpec(str(tiny_bert_dir), head="none", runtime=Runtime(device="cpu")))
    assert backend_of(vec) == "torch" and vec.encoder.describe()[AUTO_DTYPE_KEY] == "bfloat16"


def test_the_python_api_follows_the_kind(tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from condsearch.api import load_model

    for kind, dtype in (("amx", torch.bfloat16), ("other", torch.float32)):
        monkeypatch.setenv(CPU_KIND_ENV, kind)
        model = load_model(str(tiny_bert_dir), mode="case", profile="none", device="cpu")
        assert model.vectorizer.encoder.dtype == dtype  # type: ignore[attr-defined]


def test_cpu_paths_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from benchmarks.systems.cpu_paths import main as cpu_paths

    out = tmp_path / "o.json"
    assert cpu_paths(["--smoke", "--model", str(tiny_bert_dir), "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cpu_kind"] == "other"  # the tests' pinned kind is recorded
    assert set(result["speed"]["pairs_per_s_median"]) == {"torch_float32", "torch_bfloat16", "onnxruntime_float32"}
    assert -1 <= result["accuracy"]["cosine_bfloat16_float32_encoder"]["min"] <= 1


def test_quantize_auto_is_int8_only_where_it_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 61, item 6: `index --quantize auto` takes int8 per kind and mode where it beat the float path."""
    from condsearch.model import resolve_quantize

    expected = {"amx": ("none", "none"), "avx512": ("none", "int8"), "avx512_fp16": ("int8", "int8")}
    for kind in kinds.CPU_KINDS:
        monkeypatch.setenv(CPU_KIND_ENV, kind)
        case, csr = expected.get(kind, ("none", "none"))
        assert (kinds.auto_quantize("case"), kinds.auto_quantize("csr")) == (case, csr)
        assert resolve_quantize("auto", "csr", "cpu") == csr
        assert resolve_quantize("auto", "csr", "cuda") == "none"  # int8 is onnxruntime's, on the CPU
        assert resolve_quantize("none", "case", "cpu") == "none" and resolve_quantize("int8", "case", "cpu") == "int8"
        assert PATHS[kind].quantize_provenance


def test_index_quantize_auto_records_what_it_resolved_to(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "avx512_fp16")
    _index(corpus_file, tmp_path / "int8", tiny_bert_dir, "--quantize", "auto")
    assert _manifest(tmp_path / "int8").encoder.get("quantize") == "int8"
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    _index(corpus_file, tmp_path / "float", tiny_bert_dir, "--quantize", "auto")
    assert "quantize" not in _manifest(tmp_path / "float").encoder
