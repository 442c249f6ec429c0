"""The Encoder base class (with the hash encoder) and the BERT-style CASE encoder (tiny BERT)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.base.output_cache import EmbeddingCache
from condsearch.errors import ModelError
from condsearch.model.encoders import BertStyleEncoder, load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from tests.conftest import HashEncoder
from tests.tolerance import assert_rows_close, case_tolerance, pooled_tolerance

# ---------------------------------------------------------------- Encoder base class


def test_each_distinct_pair_is_embedded_once(hash_encoder: HashEncoder) -> None:
    pairs = [("colour", "a"), ("colour", "b"), ("colour", "a"), ("sport", "a"), ("colour", None), ("colour", None)]
    out = hash_encoder.encode_pairs(pairs, batch_size=2)
    seen = hash_encoder.seen
    assert len(seen) == len(set(seen)) == 4
    assert set(seen) == set(pairs)
    assert hash_encoder.stats.n_forward == 4
    expected = np.stack([HashEncoder.vector(p) for p in pairs])
    np.testing.assert_array_equal(out, expected)  # rows come back in input order
    assert out.dtype == np.float32 and out.shape == (6, 16)


def test_batches_are_length_sorted_and_bounded(hash_encoder: HashEncoder) -> None:
    sentences = ["x" * n for n in (3, 40, 1, 17, 25, 8, 60, 2, 33, 11)]
    pairs = [("c", s) for s in sentences]
    out = hash_encoder.encode_pairs(pairs, batch_size=3)
    assert [len(b) for b in hash_encoder.batches] == [3, 3, 3, 1]
    lengths = [len(c) + len(s or "") for c, s in hash_encoder.seen]
    assert lengths == sorted(lengths, reverse=True)
    np.testing.assert_array_equal(out, np.stack([HashEncoder.vector(p) for p in pairs]))


def test_encode_pairs_refuses_non_positive_batch_size(hash_encoder: HashEncoder) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        hash_encoder.encode_pairs([("c", "s")], batch_size=0)


def test_encode_pairs_of_nothing(hash_encoder: HashEncoder) -> None:
    out = hash_encoder.encode_pairs([])
    assert out.shape == (0, 16)
    assert hash_encoder.batches == []


def test_encode_case_is_conditional_minus_unconditional(hash_encoder: HashEncoder) -> None:
    sentences = ["one", "two", "three", "two", "four"]
    conditions = ["colour", "colour", "sport", "sport", "colour"]
    out = hash_encoder.encode(sentences, conditions, batch_size=2)
    expected = np.stack(
        [HashEncoder.vector((c, s)) - HashEncoder.vector((c, None)) for s, c in zip(sentences, conditions, strict=True)]
    )
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    unconditional = [p for p in hash_encoder.seen if p[1] is None]
    assert sorted(unconditional) == [("colour", None), ("sport", None)]  # once per condition


def test_a_serving_encoder_computes_each_condition_once_and_forgets_the_oldest(hash_encoder: HashEncoder) -> None:
    hash_encoder.remember_conditions(size=2)
    first = hash_encoder.encode(["a", "b"], "colour")
    again = hash_encoder.encode(["c"], "colour")
    hash_encoder.encode(["a", "a"], ["sport", "size"])  # two more conditions: "colour" is the oldest, forgotten
    hash_encoder.encode(["b"], "colour")
    bare = [p for p in hash_encoder.seen if p[1] is None]
    assert bare == [("colour", None), ("sport", None), ("size", None), ("colour", None)]
    expected = HashEncoder.vector(("colour", "c")) - HashEncoder.vector(("colour", None))
    np.testing.assert_allclose(again[0], expected, atol=1e-6)  # the remembered vector is the one computed
    np.testing.assert_allclose(first, hash_encoder.encode(["a", "b"], "colour"), atol=0)


def test_conditions_are_not_remembered_unless_asked(hash_encoder: HashEncoder) -> None:
    hash_encoder.encode(["a"], "colour")
    hash_encoder.encode(["b"], "colour")
    assert [p for p in hash_encoder.seen if p[1] is None] == [("colour", None)] * 2
    with pytest.raises(ValueError, match="at least 0"):
        hash_encoder.remember_conditions(size=-1)
    hash_encoder.remember_conditions(size=0)
    hash_encoder.encode(["c"], "colour")
    assert [p for p in hash_encoder.seen if p[1] is None] == [("colour", None)] * 3


def test_encode_case_with_one_condition_string(hash_encoder: HashEncoder) -> None:
    out = hash_encoder.encode(["a", "b", "c"], "colour")
    expected = np.stack([HashEncoder.vector(("colour", s)) - HashEncoder.vector(("colour", None)) for s in "abc"])
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert [p for p in hash_encoder.seen if p[1] is None] == [("colour", None)]


def test_encode_case_refuses_mismatched_lengths(hash_encoder: HashEncoder) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        hash_encoder.encode(["a", "b"], ["c"])


def test_pairs_without_a_sentence_encode_texts_alone(hash_encoder: HashEncoder) -> None:
    out = hash_encoder.encode_pairs([(t, None) for t in "aba"])
    np.testing.assert_array_equal(out, np.stack([HashEncoder.vector((t, None)) for t in "aba"]))
    assert hash_encoder.seen == [("a", None), ("b", None)]


def test_cache_hit_means_no_forward_pass(tmp_path: Path) -> None:
    sentences, conditions = ["red dress", "blue shirt", "green hat"], ["colour", "colour", "sport"]
    first = HashEncoder()
    expected = first.encode(sentences, conditions, cache=EmbeddingCache(tmp_path / "c"))
    assert first.batches  # the first run did the work

    second = HashEncoder()  # same identity, fresh cache object reading the shards from disk
    again = second.encode(sentences, conditions, cache=EmbeddingCache(tmp_path / "c"))
    assert second.batches == []
    assert second.stats.n_forward == 0
    np.testing.assert_array_equal(again, expected)

    third = HashEncoder()  # one new pair: only that one is embedded
    third.encode(sentences + ["pink coat"], conditions + ["colour"], cache=EmbeddingCache(tmp_path / "c"))
    assert third.seen == [("colour", "pink coat")]


def test_cache_is_keyed_by_encoder_identity(tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    HashEncoder(revision="1").encode(["a"], "colour", cache=EmbeddingCache(cache_dir))
    other = HashEncoder(revision="2")
    other.encode(["a"], "colour", cache=EmbeddingCache(cache_dir))
    assert sorted(other.seen, key=str) == sorted([("colour", None), ("colour", "a")], key=str)


def test_damaged_cache_shard_is_only_a_miss(tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    HashEncoder().encode(["a"], "colour", cache=EmbeddingCache(cache_dir))
    for shard in cache_dir.glob("shard-*.npz"):
        shard.write_bytes(b"not a zip file")
    enc = HashEncoder()
    out = enc.encode(["a"], "colour", cache=EmbeddingCache(cache_dir))
    assert len(enc.seen) == 2
    np.testing.assert_allclose(out[0], HashEncoder.vector(("colour", "a")) - HashEncoder.vector(("colour", None)))


def test_report_truncation_is_none_without_truncation(hash_encoder: HashEncoder) -> None:
    hash_encoder.encode(["a"], "c")
    assert hash_encoder.report_truncation() is None


# ---------------------------------------------------------------- BERT-style encoder (tiny BERT)

PAIRS = [
    ("color of the dress", "A girl in an orange dress serves the ball on a tennis court."),
    ("the sport being played", "Two men play soccer."),
    ("color of the dress", None),
    ("mood", "A boy rides a bicycle down a quiet street on a sunny day, and his dog runs after him."),
    ("the sport", "x"),
]


def _manual_pooled(bert_dir: Path, condition: str, sentence: str | None, max_length: int = 128) -> np.ndarray:
    """Pool the condition tokens by hand: run tokenizer(s, c) and average sequence 1 (or c alone, sequence 0)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bert_dir))
    model = AutoModel.from_pretrained(str(bert_dir)).eval()
    if sentence is None:
        enc = tok(condition, return_tensors="pt", truncation=True, max_length=max_length)
        pooled_id = 0
    else:
        enc = tok(sentence, condition, return_tensors="pt", truncation="only_first", max_length=max_length)
        pooled_id = 1
    mask = torch.tensor([1.0 if sid == pooled_id else 0.0 for sid in enc.sequence_ids(0)])
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state[0]
    return ((hidden * mask[:, None]).sum(0) / mask.sum()).numpy()


def test_tiny_bert_loads_as_bert_style_encoder(tiny_bert_dir: Path, tiny_encoder: BertStyleEncoder) -> None:
    assert isinstance(tiny_encoder, BertStyleEncoder)
    assert tiny_encoder.dim == 32
    assert tiny_encoder.max_length == 128  # the tokenizer's model_max_length
    assert tiny_encoder.model_id == str(tiny_bert_dir.resolve())
    assert tiny_encoder.revision.startswith("dir-")
    described = tiny_encoder.describe()
    assert described["pooling"] == "condition-mean" and described["max_length"] == 128 and described["dim"] == 32


@pytest.mark.numerics
def test_pooling_is_batch_invariant(tiny_encoder: BertStyleEncoder) -> None:
    together = tiny_encoder.encode_batch(PAIRS)
    assert together.shape == (len(PAIRS), 32) and together.dtype == np.float32
    alone = np.concatenate([tiny_encoder.encode_batch([pair]) for pair in PAIRS])
    assert_rows_close(alone, together, pooled_tolerance(tiny_encoder, PAIRS))


@pytest.mark.numerics
def test_a_bert_encoder_batches_by_token_count_not_characters(
    tiny_encoder: BertStyleEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condsearch.model.encoders.bert_inputs import token_lengths

    # whole words are one token each in the tiny vocabulary, unknown letters one token per letter
    pairs = [("colour", "dress dress dress dress"), ("colour", "q w e r t y u i o p"), ("colour", "xq")]
    tokens = token_lengths(tiny_encoder.tokenizer, pairs)
    chars = [len(s or "") for _, s in pairs]
    assert tokens[1] > tokens[0] and chars[0] > chars[1]  # the two orders disagree
    seen: list[tuple[str, str | None]] = []
    inner = tiny_encoder.encode_batch
    monkeypatch.setattr(tiny_encoder, "encode_batch", lambda batch: (seen.extend(batch), inner(batch))[1])
    out = tiny_encoder.encode_pairs(pairs, batch_size=1)
    assert seen == sorted(pairs, key=lambda p: -tokens[pairs.index(p)])
    assert_rows_close(out, inner(pairs), pooled_tolerance(tiny_encoder, pairs))  # rows back in input order
    assert token_lengths(tiny_encoder.tokenizer, []) == []  # nothing left to encode (every pair cached)


@pytest.mark.numerics
def test_encode_pairs_batch_size_does_not_change_vectors(tiny_encoder: BertStyleEncoder) -> None:
    one = tiny_encoder.encode_pairs(PAIRS, batch_size=1)
    all_ = tiny_encoder.encode_pairs(PAIRS, batch_size=64)
    assert_rows_close(one, all_, pooled_tolerance(tiny_encoder, PAIRS))


@pytest.mark.numerics
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}|{(p[1] or '<none>')[:12]}")
def test_only_condition_tokens_are_pooled(tiny_bert_dir: Path, tiny_encoder: BertStyleEncoder, pair) -> None:
    got = tiny_encoder.encode_batch(PAIRS)[PAIRS.index(pair)]
    assert_rows_close(got[None], _manual_pooled(tiny_bert_dir, *pair)[None], pooled_tolerance(tiny_encoder, [pair]))


@pytest.mark.numerics
def test_sentence_steers_the_condition_vector(tiny_encoder: BertStyleEncoder) -> None:
    vecs = tiny_encoder.encode_batch(
        [("color of the dress", "a red dress"), ("color of the dress", "a blue dress"), ("color of the dress", None)]
    )
    assert not np.allclose(vecs[0], vecs[1], atol=1e-4)
    assert not np.allclose(vecs[0], vecs[2], atol=1e-4)
    case = tiny_encoder.encode(["a red dress"], "color of the dress")
    assert_rows_close(
        case, (vecs[0] - vecs[2])[None], case_tolerance(tiny_encoder, ["a red dress"], "color of the dress")
    )


@pytest.mark.numerics
def test_long_sentence_is_truncated_and_counted(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    long_sentence = " ".join(["the girl in the orange dress plays tennis"] * 60)  # ~480 tokens > 128
    out = encoder.encode([long_sentence, "a short one"], "color of the dress")
    assert np.isfinite(out).all()
    assert encoder.stats.n_truncated == 1
    notice = encoder.report_truncation()
    assert notice is not None and "1 input(s)" in notice and "truncated" in notice
    assert "\n" not in notice
    assert encoder.report_truncation() is None  # reported once, then reset
    # The sentence is what gets cut: every condition token is still pooled.
    got = encoder.encode_batch([("color of the dress", long_sentence)])[0]
    pair = ("color of the dress", long_sentence)
    assert_rows_close(got[None], _manual_pooled(tiny_bert_dir, *pair)[None], pooled_tolerance(encoder, [pair]))


@pytest.mark.numerics
def test_max_length_override(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), max_length=16, runtime=Runtime(device="cpu")))
    assert encoder.max_length == 16 and encoder.describe()["max_length"] == 16
    sentence = "a girl in an orange dress serves the ball on a tennis court in the park"
    got = encoder.encode_batch([("color of the dress", sentence)])[0]
    assert encoder.stats.n_truncated == 1
    want = _manual_pooled(tiny_bert_dir, "color of the dress", sentence, max_length=16)
    assert_rows_close(got[None], want[None], pooled_tolerance(encoder, [("color of the dress", sentence)]))


def test_non_ascii_text(tiny_encoder: BertStyleEncoder) -> None:
    pairs = [
        ("couleur de la robe", "Une fille en robe orange sert la balle — à Zürich, naïve café"),
        ("颜色", "一个穿橙色裙子的女孩在发球 🎾"),
        ("color of the dress", "\u00a0Ünïcödé\u200b spaces\ttabs\nnewlines"),
    ]
    out = tiny_encoder.encode([s for _, s in pairs], [c for c, _ in pairs])
    assert out.shape == (3, 32)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, tiny_encoder.encode([s for _, s in pairs], [c for c, _ in pairs]), atol=1e-6)


def test_model_folder_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="config.json"):
        load_encoder(EncoderSpec(str(tmp_path / "empty")))


def test_missing_model_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such model folder"):
        load_encoder(EncoderSpec(str(tmp_path / "nope")))


def test_unloadable_model_folder_is_a_model_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError, match="cannot load model"):
        load_encoder(EncoderSpec(str(folder)))


def test_limit_respects_position_embeddings_when_tokenizer_has_no_limit(tiny_bert_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-limit"
    shutil.copytree(tiny_bert_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("model_max_length", None)
    config_path.write_text(json.dumps(config))
    encoder = load_encoder(EncoderSpec(str(folder), runtime=Runtime(device="cpu")))
    out = encoder.encode([" ".join(["orange dress"] * 200)], "color of the dress")
    assert np.isfinite(out).all()
    assert encoder.stats.n_truncated == 1


def test_a_truncation_notice_counts_only_its_own_threads_inputs(tiny_bert_dir: Path) -> None:
    import threading

    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), max_length=16, runtime=Runtime(device="cpu")))
    long = "a girl in an orange dress serves the ball on a tennis court in the park"  # > 16 tokens
    both_encoded = threading.Barrier(2)
    notices: dict[int, str | None] = {}

    def run(n_long: int) -> None:
        encoder.encode([f"{long} {i}" for i in range(n_long)] + ["a dog"], "color of the dress")
        both_encoded.wait(timeout=60)  # the other thread's inputs are truncated before this one reports
        notices[n_long] = encoder.report_truncation()

    threads = [threading.Thread(target=run, args=(n,)) for n in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert notices[2] is not None and notices[2].startswith("2 input(s)")
    assert notices[3] is not None and notices[3].startswith("3 input(s)")
    assert encoder.report_truncation() is None  # this thread truncated nothing
