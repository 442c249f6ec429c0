"""The torch-free one-shot query: numpy's BERT forward pass and head give torch's vectors, and only
for the model, adapter and head an index was built with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.cache import default_cache_dir
from condsearch.cli import main
from condsearch.encoders import bert_inference, load_encoder
from condsearch.encoders.inference_copy import CHECKED_KEY, CONFIG_FILE
from condsearch.encoders.numpy_bert import NumpyBert, NumpyBertEncoder, gelu, load_numpy_encoder
from condsearch.head import HeadConfig, ProjectionHead, save_head
from condsearch.head_files import load_numpy_head
from condsearch.models import resolve_model
from condsearch.pipeline import numpy_vectorizer_for, vectorizer_for
from condsearch.store import IndexStore
from tests.conftest import SENTENCES
from tests.test_bert_inference import PAIRS, _adapter

COLOUR = "color of the dress"


def _copy() -> Path:
    (folder,) = [p for p in (default_cache_dir() / "bert-inference").glob("*") if not p.name.startswith(".")]
    return folder


def test_gelu_equals_torch() -> None:
    x = np.linspace(-8, 8, 10_001, dtype=np.float32)
    want = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(gelu(x), want, rtol=0, atol=2e-6)  # float32 spacing at 8 is 1e-6


def test_numpy_forward_equals_transformers(tiny_bert_dir: Path) -> None:
    hf = load_encoder(str(tiny_bert_dir), device="cpu")
    weights = {k: v.numpy() for k, v in hf.model.state_dict().items()}
    batch, _ = hf._tokenize(PAIRS)  # padded, one input truncated
    with torch.inference_mode():
        want = hf.model(**batch).last_hidden_state.numpy()
    arrays = {k: v.numpy() for k, v in batch.items()}
    got = NumpyBert(hf.model.config.to_dict(), weights).forward(
        arrays["input_ids"], arrays["attention_mask"], arrays.get("token_type_ids")
    )
    real = arrays["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_adapter", [False, True])
def test_numpy_encoder_equals_the_torch_encoder(tiny_bert_dir: Path, tmp_path: Path, with_adapter: bool) -> None:
    adapter = _adapter(tiny_bert_dir, tmp_path / "ad") if with_adapter else None
    source = resolve_model(str(tiny_bert_dir))
    assert load_numpy_encoder(source, max_length=None, adapter=adapter) is None  # no copy yet
    reference = load_encoder(str(tiny_bert_dir), device="cpu", adapter=adapter, inference=True)  # writes it
    assert json.loads((_copy() / CONFIG_FILE).read_text())[CHECKED_KEY] is True
    light = load_numpy_encoder(source, max_length=None, adapter=adapter)
    assert isinstance(light, NumpyBertEncoder) and light.describe() == reference.describe()
    want = reference.encode_case(SENTENCES, COLOUR)
    np.testing.assert_allclose(light.encode_case(SENTENCES, COLOUR), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(light.encode_case(SENTENCES[:1], COLOUR), want[:1], rtol=1e-5, atol=1e-5)
    long = ["tennis " * 200]  # truncated alike, and reported
    np.testing.assert_allclose(
        light.encode_case(long, COLOUR), reference.encode_case(long, COLOUR), rtol=1e-5, atol=1e-5
    )
    assert light.report_truncation() is not None
    short = load_numpy_encoder(source, max_length=12, adapter=adapter)
    assert short is not None and short.max_length == 12


def test_a_copy_not_checked_for_numpy_is_not_used(tiny_bert_dir: Path) -> None:
    load_encoder(str(tiny_bert_dir), device="cpu", inference=True)
    meta_file = _copy() / CONFIG_FILE
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, CHECKED_KEY: False}))
    assert load_numpy_encoder(resolve_model(str(tiny_bert_dir)), max_length=None, adapter=None) is None
    assert bert_inference.load_copy(_copy()) is not None  # torch still reads it


def test_numpy_head_equals_the_torch_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = ProjectionHead(HeadConfig(input_dim=32, dim=8))
    save_head(head, tmp_path / "head")
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    light = load_numpy_head(tmp_path / "head")
    assert light.config == head.config
    np.testing.assert_allclose(light.project(x), head.project(x), rtol=1e-6, atol=1e-6)


def _index(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path, head: str) -> None:
    args = ["index", str(corpus_file), "-c", COLOUR, "--model", str(tiny_bert_dir), "--head", head]
    result = CliRunner().invoke(main, [*args, "--index-dir", str(index_dir)])
    assert result.exit_code == 0, result.output


def test_numpy_vectorizer_only_for_the_index_own_model_and_head(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    torch.manual_seed(1)
    head_dir = tmp_path / "head"
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=16, model_id=str(tiny_bert_dir))), head_dir)
    index_dir = tmp_path / "indexes"
    _index(tiny_bert_dir, corpus_file, index_dir, str(head_dir))
    store = IndexStore(index_dir)
    manifest = store.read_manifest(store.find(COLOUR))
    reference = vectorizer_for(manifest, device="cpu")  # the torch path; it writes the copy
    light = numpy_vectorizer_for(manifest)
    assert light is not None and isinstance(light.encoder, NumpyBertEncoder)
    assert (light.head_name, light.head_checksum, light.dim) == (manifest.head, manifest.head_checksum, 16)
    np.testing.assert_allclose(
        light.vectors(SENTENCES, COLOUR), reference.vectors(SENTENCES, COLOUR), rtol=1e-5, atol=1e-5
    )
    # a head changed since indexing: not this path (vectorizer_for says why the index cannot be used)
    torch.manual_seed(2)
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=16, model_id=str(tiny_bert_dir))), head_dir)
    assert numpy_vectorizer_for(manifest) is None


def test_a_repeated_one_shot_query_imports_no_torch_and_answers_alike(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    index_dir = str(tmp_path / "indexes")
    _index(tiny_bert_dir, corpus_file, Path(index_dir), "none")
    argv = ["query", SENTENCES[2], SENTENCES[5], "-c", COLOUR, "-k", "3", "--json", "--index-dir", index_dir]
    # --head none names the index's own head, which takes the torch path (and writes the copy)
    with_torch = CliRunner().invoke(main, [*argv, "--head", "none"])
    assert with_torch.exit_code == 0, with_torch.output
    code = (
        "import sys\nfrom condsearch.cli import main\ntry:\n"
        f"    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code\n"
        "loaded = {'torch', 'transformers'} & set(sys.modules)\nassert not loaded, loaded"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    want = [json.loads(line) for line in with_torch.stdout.splitlines()]
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [[h["id"] for h in a["results"]] for a in got] == [[h["id"] for h in a["results"]] for a in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose([h["score"] for h in a["results"]], [h["score"] for h in b["results"]], atol=1e-5)
