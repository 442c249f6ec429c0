"""The cached inference copy of BERT-style encoders: the same vectors as transformers, without importing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.artifacts.files import PEFT_CONFIG
from condsearch.cache import default_cache_dir
from condsearch.encoders import bert_inference, load_encoder
from condsearch.encoders.bert import BertStyleEncoder
from condsearch.errors import ModelError
from condsearch.models import resolve_model
from condsearch.train.adapter import save_adapter
from condsearch.train.lora import LoraConfig, add_lora, lora_state
from tests.conftest import SENTENCES

COLOUR = "color of the dress"
# pairs and singles, a long one that is truncated, a blank-ish one
PAIRS = [(COLOUR, s) for s in SENTENCES] + [(COLOUR, None), ("sport", "tennis " * 200), ("mood", "!")]


def _copies(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "bert-inference").glob("*") if not p.name.startswith("."))


def _adapter(tiny_bert_dir: Path, out: Path) -> Path:
    enc = load_encoder(str(tiny_bert_dir), device="cpu")
    torch.manual_seed(0)
    add_lora(enc.model, LoraConfig(rank=2))
    with torch.no_grad():
        for name, p in lora_state(enc.model).items():
            if name.endswith("lora_b"):
                p.normal_(0, 0.5)
    save_adapter(enc, LoraConfig(rank=2), out)
    return out


def test_plain_forward_equals_transformers(tiny_bert_dir: Path) -> None:
    hf = load_encoder(str(tiny_bert_dir), device="cpu")
    config = {k: getattr(hf.model.config, k) for k in bert_inference._CONFIG_KEYS}
    wanted = set(bert_inference.PlainBert(config).state_dict())
    plain = bert_inference.PlainBert(config).load({k: v for k, v in hf.model.state_dict().items() if k in wanted})
    batch, _ = hf._tokenize(PAIRS)
    with torch.inference_mode():
        want = hf.model(**batch).last_hidden_state
        got = plain(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_backend_tokenizer_equals_transformers(tiny_bert_dir: Path, tmp_path: Path) -> None:
    hf = load_encoder(str(tiny_bert_dir), device="cpu")
    assert bert_inference.save_copy(tmp_path / "copy", hf.tokenizer, hf.model)
    loaded = bert_inference.load_copy(tmp_path / "copy")
    assert loaded is not None
    tok = loaded[0]
    firsts, seconds = [s or c for c, s in PAIRS], [c for c, _ in PAIRS]
    for args, kw in [
        ((firsts, seconds), {"truncation": "longest_first", "max_length": 24}),
        ((firsts,), {"truncation": "longest_first", "max_length": 24}),
        ((firsts,), {"add_special_tokens": False}),
    ]:
        want, got = hf.tokenizer(*args, **kw), tok(*args, **kw)
        assert dict(got) == {k: want[k] for k in want.keys()}
        assert [got.sequence_ids(i) for i in range(len(firsts))] == [want.sequence_ids(i) for i in range(len(firsts))]
    for pair in (True, False):
        assert tok.num_special_tokens_to_add(pair=pair) == hf.tokenizer.num_special_tokens_to_add(pair=pair)
    assert (tok.pad_token_id, tok.model_max_length) == (hf.tokenizer.pad_token_id, hf.tokenizer.model_max_length)


@pytest.mark.parametrize("with_adapter", [False, True])
def test_inference_loads_the_same_encoder_from_the_cache(
    tiny_bert_dir: Path, tmp_path: Path, with_adapter: bool
) -> None:
    adapter = _adapter(tiny_bert_dir, tmp_path / "ad") if with_adapter else None
    cache = default_cache_dir()
    reference = load_encoder(str(tiny_bert_dir), device="cpu", adapter=adapter)
    first = load_encoder(str(tiny_bert_dir), device="cpu", adapter=adapter, inference=True)  # writes the copy
    assert len(_copies(cache)) == 1
    second = load_encoder(str(tiny_bert_dir), device="cpu", adapter=adapter, inference=True)  # reads it
    assert isinstance(second, BertStyleEncoder) and isinstance(second.model, bert_inference.PlainBert)
    assert second.describe() == first.describe() == reference.describe()
    want = reference.encode_case(SENTENCES, COLOUR)
    np.testing.assert_allclose(second.encode_case(SENTENCES, COLOUR), want, rtol=1e-5, atol=1e-5)
    # a text alone equals the same text in a padded batch
    np.testing.assert_allclose(second.encode_case(SENTENCES[:1], COLOUR), want[:1], rtol=1e-5, atol=1e-5)


def test_copies_are_keyed_by_adapter_and_model(tiny_bert_dir: Path, other_bert_dir: Path, tmp_path: Path) -> None:
    adapter = _adapter(tiny_bert_dir, tmp_path / "ad")
    cache = default_cache_dir()
    load_encoder(str(tiny_bert_dir), device="cpu", inference=True)
    load_encoder(str(tiny_bert_dir), device="cpu", adapter=adapter, inference=True)
    load_encoder(str(other_bert_dir), device="cpu", inference=True)
    assert len(_copies(cache)) == 3
    # the config takes part (alpha scales the merged update) as well as the weights
    meta = json.loads((adapter / PEFT_CONFIG).read_text())
    (adapter / PEFT_CONFIG).write_text(json.dumps({**meta, "lora_alpha": meta["lora_alpha"] * 2}))
    source = resolve_model(str(tiny_bert_dir))
    assert bert_inference.cache_folder(source, bert_inference.adapter_key(adapter)) not in _copies(cache)
    # a hub model not in the local cache has no fixed revision: never cached
    assert bert_inference.cache_folder(source.__class__("x/y", "x/y", "main", local=False), "") is None


def test_adapter_is_still_checked_when_read_from_the_cache(
    tiny_bert_dir: Path, other_bert_dir: Path, tmp_path: Path
) -> None:
    adapter = _adapter(tiny_bert_dir, tmp_path / "ad")
    load_encoder(str(tiny_bert_dir), device="cpu", adapter=adapter, inference=True)
    with pytest.raises(ModelError, match="trained for"):
        load_encoder(str(other_bert_dir), device="cpu", adapter=adapter, inference=True)


def test_a_damaged_copy_is_a_cache_miss_and_is_rewritten(tiny_bert_dir: Path) -> None:
    reference = load_encoder(str(tiny_bert_dir), device="cpu").encode_case(SENTENCES, COLOUR)
    load_encoder(str(tiny_bert_dir), device="cpu", inference=True)
    (copy,) = _copies(default_cache_dir())
    (copy / bert_inference.WEIGHTS_FILE).write_bytes(b"not safetensors")
    again = load_encoder(str(tiny_bert_dir), device="cpu", inference=True)
    assert not isinstance(again.model, bert_inference.PlainBert)  # loaded by transformers
    np.testing.assert_allclose(again.encode_case(SENTENCES, COLOUR), reference, rtol=1e-5, atol=1e-5)
    assert bert_inference.load_copy(copy) is not None  # and written afresh


def test_unsupported_models_and_training_use_transformers(tiny_bert_dir: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_bert_dir / "config.json").read_text())
    assert bert_inference.supports(config)
    assert not bert_inference.supports({**config, "position_embedding_type": "relative_key"})
    assert not bert_inference.supports({**config, "auto_map": {"AutoModel": "x.Y"}})
    assert not bert_inference.supports({**config, "model_type": "roberta"})
    trained = load_encoder(str(tiny_bert_dir), device="cpu")  # no inference=True: what fine-tuning gets
    assert not isinstance(trained.model, bert_inference.PlainBert)
    assert _copies(default_cache_dir()) == []


def test_reading_the_copy_imports_no_transformers(tiny_bert_dir: Path) -> None:
    load_encoder(str(tiny_bert_dir), device="cpu", inference=True)
    code = (
        "import sys; from condsearch.encoders import load_encoder; "
        f"e = load_encoder({str(tiny_bert_dir)!r}, device='cpu', inference=True); "
        "e.encode_case(['a girl in a red dress'], 'color'); "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
