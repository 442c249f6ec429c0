"""--quantize int8: onnxruntime's dynamic int8 export of the tiny BERT, its cache and the manifest rule."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from condsearch.base.model_sources import resolve_model
from condsearch.errors import ModelError
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.onnx import bert as onnx_bert
from condsearch.model.encoders.onnx import cache as onnx_cache
from condsearch.model.encoders.onnx.export import pooled_cosines
from condsearch.model.encoders.onnx.run import RUN_ROWS
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from tests.cli.test_cli import assert_clean_error, ok, query, run
from tests.conftest import SENTENCES as CORPUS
from tests.tolerance import assert_rows_close, pooled_tolerance

SENTENCES = [
    "A girl in an orange dress serves the ball",
    "Two dogs run on the beach",
    "A man rides a red bike on the road",
    "the team plays soccer on the grass field",
]
COLOUR = "color of the dress"


@pytest.fixture(scope="module")
def int8_dir(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the tiny BERT's int8 export (written once for the module)."""
    cache = tmp_path_factory.mktemp("int8-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONDSEARCH_CACHE_DIR", str(cache))
        load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))
    return cache


@pytest.mark.numerics
def test_int8_case_vectors_are_close_to_float32(
    tiny_bert_dir: Path, int8_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(int8_dir))
    float32 = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    int8 = load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))
    assert type(int8).__name__ == "OnnxBertEncoder" and int8.precision == "int8"
    a, b = float32.encode(SENTENCES, COLOUR), int8.encode(SENTENCES, COLOUR)
    assert a.shape == b.shape and b.dtype == np.float32
    assert pooled_cosines(a, b).min() > 0.95
    # the pooled condition segment too, and one input alone is its value in a padded batch, nearly:
    # dynamic quantisation takes one activation scale per batch, so the batch moves it a little
    pairs = [(COLOUR, s) for s in SENTENCES]
    assert pooled_cosines(float32.encode_pairs(pairs), int8.encode_pairs(pairs)).min() > 0.99
    # the batch moves each quantised activation by less than one int8 step (1/255 of its range, at most
    # twice its magnitude); the pooled mean averages those shifts, so a step at the pooled magnitude bounds it
    together = int8.encode_pairs(pairs)
    alone = np.concatenate([int8.encode_pairs([pair]) for pair in pairs])
    assert_rows_close(alone, together, np.abs(together).max(axis=1) * 2 / 255)


def test_describe_records_int8_and_rebuilds_it(tiny_bert_dir: Path, int8_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(int8_dir))
    described = load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8")).describe()
    assert described["quantize"] == "int8" and str(described["quantize_runtime"]).startswith("onnxruntime ")
    assert EncoderSpec.recorded(described, "case", "none").quantize == "int8"
    assert "quantize" not in load_encoder(EncoderSpec(str(tiny_bert_dir))).describe()


def test_the_export_is_cached_and_reused(tiny_bert_dir: Path, int8_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(int8_dir))
    folders = [p for p in (int8_dir / onnx_cache.CACHE_SUBDIR).iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1 and (folders[0] / onnx_bert.MODEL_FILE).is_file()
    meta = json.loads((folders[0] / onnx_cache.META_FILE).read_text())
    assert meta["runtime"]["onnxruntime"] and meta["precision"] == "int8" and meta["usable"] is True

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_bert, "export_onnx", no_export)
    load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))  # read from the cache, not exported
    # another runtime version is another key: exported again
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1" if name == "onnxruntime" else real(name))
    with pytest.raises(AssertionError, match="exported again"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))


def test_a_damaged_export_is_only_a_cache_miss(tiny_bert_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(tmp_path))
    load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))
    (folder,) = (tmp_path / onnx_cache.CACHE_SUBDIR).iterdir()
    (folder / onnx_bert.MODEL_FILE).write_bytes(b"not a model")
    assert load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8")).encode(SENTENCES[:1], COLOUR).shape == (
        1,
        32,
    )
    assert onnx_bert.read_export(folder, resolve_model(str(tiny_bert_dir)), max_length=None, threads=1) is not None


def test_missing_onnxruntime_is_one_line(tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "onnxruntime":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(ModelError, match=r"^the ONNX encoder needs onnxruntime: pip install onnxruntime$"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))


def test_int8_refuses_what_it_does_not_cover(tiny_bert_dir: Path) -> None:
    with pytest.raises(ModelError, match="CPU"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8", dtype="bfloat16"))
    with pytest.raises(ModelError, match="condition-mean"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8", pooling="mean"))
    with pytest.raises(ModelError, match="unknown quantisation"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int4"))


def test_query_refuses_another_quantisation(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, int8_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(int8_dir))
    int8_index, float_index = tmp_path / "int8", tmp_path / "float32"
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--threads", "1"]
    ok(run("index", corpus_file, *common, "--quantize", "int8", "--index-dir", int8_index))
    ok(run("index", corpus_file, *common, "--index-dir", float_index))
    manifest = json.loads(next(int8_index.glob("*/manifest.json")).read_text())
    assert manifest["encoder"]["quantize"] == "int8"
    # as built: the int8 index answers with the int8 encoder, and ranks its own rows first
    hits = json.loads(ok(query(int8_index, CORPUS[0], "-c", COLOUR, "-k", 1, "--json")).stdout)
    assert hits["results"][0]["text"] == CORPUS[0] and hits["results"][0]["score"] > 0.99
    ok(query(int8_index, SENTENCES[0], "-c", COLOUR, "--quantize", "int8"))
    message = assert_clean_error(query(int8_index, SENTENCES[0], "-c", COLOUR, "--quantize", "none"))
    assert "--quantize int8, not none" in message
    message = assert_clean_error(query(float_index, SENTENCES[0], "-c", COLOUR, "--quantize", "int8"))
    assert "--quantize none, not int8" in message


def test_csr_index_runs_int8(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    """The router runs as its int8 export too (issue 41), recorded as CASE's int8 is (more: csr/test_csr_onnx.py)."""
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--mode", "csr", "--router", "none", "--threads", "1"]
    result = ok(run("index", corpus_file, *common, "--quantize", "int8", "--json", "--index-dir", tmp_path))
    assert json.loads(result.stdout)["backend"] == "onnxruntime"
    manifest = json.loads(next(tmp_path.glob("*/manifest.json")).read_text())
    assert manifest["encoder"]["quantize"] == "int8" and manifest["spec"]["quantize"] == "int8"
    hits = json.loads(ok(query(tmp_path, CORPUS[0], "-c", COLOUR, "-k", 1, "--json")).stdout)
    assert hits["results"][0]["text"] == CORPUS[0]


class _Recorder:
    """An onnxruntime session that notes the shape of each run's input ids."""

    def __init__(self, session: Any) -> None:
        self.session, self.shapes = session, []

    def get_inputs(self) -> Any:
        return self.session.get_inputs()

    def run(self, outputs: Any, feeds: dict[str, np.ndarray]) -> Any:
        self.shapes.append(feeds["input_ids"].shape)
        return self.session.run(outputs, feeds)


# lengths that differ, a condition alone among them, and one that is truncated
MIXED = [(COLOUR, s) for s in SENTENCES] + [(COLOUR, None), ("mood", "!"), ("sport", "tennis " * 200)]


@pytest.mark.numerics
def test_a_batch_runs_as_runs_of_like_length_with_the_same_vectors(tiny_bert_dir: Path) -> None:
    source = resolve_model(str(tiny_bert_dir))
    reference = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    light, refused = onnx_bert.write_export(reference, source, None, "float32", max_length=None, threads=1)
    assert refused is None and light is not None and light.run_rows == RUN_ROWS
    whole = light.encode_batch(MIXED)
    light.run_rows = 2
    recorder = _Recorder(light.session)
    light.session = recorder
    runs = light.encode_batch(MIXED)
    # float32: the same vectors (and torch's), whatever the runs
    tolerance = pooled_tolerance(reference, MIXED)
    assert_rows_close(runs, whole, tolerance)
    assert_rows_close(runs, reference.encode_batch(MIXED), tolerance)
    # four runs of two rows, longest first, each padded only to its own longest row
    assert [rows for rows, _ in recorder.shapes] == [2, 2, 2, 1]
    widths = [width for _, width in recorder.shapes]
    assert widths == sorted(widths, reverse=True) and widths[0] == light.max_length > widths[-1]

    def length(c: str, s: str | None) -> int:
        texts = ([s], [c]) if s is not None else ([c], None)
        return len(light.tokenizer(*texts, truncation=True, max_length=light.max_length)["input_ids"][0])

    lengths = sorted((length(c, s) for c, s in MIXED), reverse=True)
    assert widths == lengths[::2]


def test_int8_runs_stay_close_to_one_run(tiny_bert_dir: Path, int8_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(int8_dir))
    int8 = load_encoder(EncoderSpec(str(tiny_bert_dir), quantize="int8"))
    assert isinstance(int8, onnx_bert.OnnxBertEncoder)
    pairs = MIXED * 3  # more than one run of RUN_ROWS
    recorder = _Recorder(int8.session)
    int8.session = recorder
    runs = int8.encode_batch(pairs)
    assert len(recorder.shapes) == -(-len(pairs) // RUN_ROWS) > 1
    int8.run_rows = 0  # the whole batch in one run, as before
    whole = int8.encode_batch(pairs)
    assert len(recorder.shapes) == 3 and recorder.shapes[-1][0] == len(pairs)
    # dynamic quantisation scales activations per run: nearly, not exactly, the same vectors
    assert pooled_cosines(runs, whole).min() > 0.99
