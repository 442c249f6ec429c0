"""Issue 58: one model's tokenizer called from the server's two lanes at once gives each call its own settings."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import numpy as np
import pytest

from condsearch.base.model_sources import resolve_model
from condsearch.model.encoders.backbone import load_backbone
from condsearch.model.encoders.serial_tokenizer import SerialTokenizer

LONG = ["a much longer sentence with many more words than the other one has", "short"] * 64
PLAIN = ["the dog runs", "a cat"] * 64


def test_calls_from_two_threads_keep_their_own_padding_and_truncation(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the tokenizer lets go of the GIL while it encodes a batch in parallel, as the server's does: the calls overlap
    # (without SerialTokenizer's lock, about every run here mixes their settings)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    tokenizer, _ = load_backbone(resolve_model(str(tiny_bert_dir)))
    assert isinstance(tokenizer, SerialTokenizer)
    padded_alone = tokenizer(LONG, padding=True, truncation=True, max_length=8, return_tensors="np")["input_ids"]
    plain_alone = tokenizer(PLAIN, add_special_tokens=True)["input_ids"]
    wrong: list[str] = []

    def padded() -> None:
        for _ in range(300):
            got = tokenizer(LONG, padding=True, truncation=True, max_length=8, return_tensors="np")["input_ids"]
            if not np.array_equal(got, padded_alone):
                wrong.append("padded")

    def plain() -> None:
        for _ in range(300):
            if tokenizer(PLAIN, add_special_tokens=True)["input_ids"] != plain_alone:
                wrong.append("plain")

    threads = [threading.Thread(target=padded), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert padded_alone.shape == (128, 8) and not wrong, wrong[:5]


def test_it_is_the_tokenizer_in_every_other_way(tiny_bert_dir: Path) -> None:
    tokenizer, _ = load_backbone(resolve_model(str(tiny_bert_dir)))
    inner = tokenizer.unwrapped
    assert tokenizer.pad_token_id == inner.pad_token_id and tokenizer.is_fast
    tokenizer.model_max_length = 64  # set on the tokenizer itself
    assert inner.model_max_length == 64
    twin = copy.deepcopy(tokenizer)  # through __reduce__, as a copy sent to a Ray worker is made
    assert isinstance(twin, SerialTokenizer) and twin(PLAIN)["input_ids"] == tokenizer(PLAIN)["input_ids"]
    assert SerialTokenizer(tokenizer).unwrapped is inner  # wrapped once
