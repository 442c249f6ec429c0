"""The ONNX export's tracing source and tokenizer: PlainBert and BackendTokenizer compute what transformers does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.onnx.export import tokenizer_files
from condsearch.model.encoders.onnx.run import BackendTokenizer
from condsearch.model.encoders.onnx.trace import PlainBert, as_plain, supports
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train.adapter import save_adapter
from condsearch.train.lora import LoraConfig, add_lora, lora_state
from tests.conftest import SENTENCES
from tests.tolerance import float32_tolerance, largest_activation, transformer_depth

COLOUR = "color of the dress"
# pairs and singles, a long one that is truncated, a blank-ish one
PAIRS = [(COLOUR, s) for s in SENTENCES] + [(COLOUR, None), ("sport", "tennis " * 200), ("mood", "!")]


def _adapter(tiny_bert_dir: Path, out: Path) -> Path:
    enc = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    torch.manual_seed(0)
    add_lora(enc.model, LoraConfig(rank=2))
    with torch.no_grad():
        for name, p in lora_state(enc.model).items():
            if name.endswith("lora_b"):
                p.normal_(0, 0.5)
    save_adapter(enc, LoraConfig(rank=2), out)
    return out


@pytest.mark.numerics
def test_plain_forward_equals_transformers(tiny_bert_dir: Path) -> None:
    hf = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    plain = as_plain(hf.model)
    assert isinstance(plain, PlainBert)
    batch, _ = hf._tokenize(PAIRS)
    with torch.inference_mode(), largest_activation(hf.model) as scale:
        want = hf.model(**batch).last_hidden_state
    with torch.inference_mode():
        got = plain(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    tolerance = float32_tolerance(scale, depth=transformer_depth(hf.model))
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=tolerance)


def test_backend_tokenizer_equals_transformers(tiny_bert_dir: Path) -> None:
    from tokenizers import Tokenizer

    hf = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    text, meta = tokenizer_files(hf.tokenizer)
    tok = BackendTokenizer(Tokenizer.from_str(text), meta)
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


def test_only_plain_berts_are_traced_through_plain_bert(tiny_bert_dir: Path) -> None:
    config = json.loads((tiny_bert_dir / "config.json").read_text())
    assert supports(config)
    assert not supports({**config, "position_embedding_type": "relative_key"})
    assert not supports({**config, "auto_map": {"AutoModel": "x.Y"}})
    assert not supports({**config, "model_type": "roberta"})
