"""LLM embedders for CASE (Qwen3-Embedding, gte-Qwen2, e5/SFR-Mistral, NV-Embed) on tiny random models."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.base.faiss_indexes import build_index, exact_search, normalize, search, torch_flat_index
from condsearch.errors import ModelError
from condsearch.model.encoders import load_encoder, model_config
from condsearch.model.encoders.decoder import PromptEncoder
from condsearch.model.encoders.family import (
    CASE_PROMPT,
    CASE_UNCONDITIONAL,
    PromptTemplates,
    default_pooling,
    default_templates,
    detect_family,
)
from condsearch.model.encoders.parallel import ReplicatedEncoder, split_evenly
from condsearch.model.encoders.pooling import last_token_pool, mean_pool
from condsearch.model.encoders.runtime import OomBackoff, resolve_dtype
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.head import HeadConfig, ProjectionHead, save_head
from condsearch.model.vectorizer import load_vectorizer
from condsearch.train.head import HeadTrainConfig, PairFeatures, evaluate_head, fit_head
from tests.conftest import assert_same_ranking
from tests.tolerance import assert_rows_close, case_tolerance, pooled_tolerance, score_tolerance

COLOUR = "color of the dress"
SENTENCE = "A girl in an orange dress serves the ball on a tennis court."
PAIRS = [
    (COLOUR, SENTENCE),
    (COLOUR, "a red dress"),
    ("the sport", "two men play soccer on a grass field in the park"),
    (COLOUR, None),
    ("the sport", None),
]
_WORDS = """
instruct retrieve semantically similar texts to given query under condition
a an the and of in on at with girl girls woman man men boy dog orange red blue green dress shirt hat
serves serve ball tennis court soccer field grass park play plays two color colour sport
""".split()
_PUNCT = list(".,:;!?'-")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# ----------------------------------------------------------------- tiny models, built offline


def _save_bpe_tokenizer(folder: Path, specials: list[str], *, prefix: str = "", suffix: str = "", **tokens: str):
    """Train and save a tiny byte-level BPE fast tokenizer (specials first); return its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    lines = [PromptTemplates().render(c, s) for c, s in PAIRS] + [" ".join(_WORDS)] * 3
    tok.train_from_iterator(lines, trainer)
    vocab = tok.get_vocab()
    if prefix or suffix:
        single = " ".join(p for p in (prefix, "$A", suffix) if p)
        used = [t for t in (prefix, suffix) if t]
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[(t, vocab[t]) for t in used])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=96, **tokens)
    wrapped.save_pretrained(str(folder))
    return tok.get_vocab_size()


def make_decoder(folder: Path, kind: str, seed: int = 0) -> Path:
    """Save a tiny random decoder (hidden 32, 2 layers) shaped like a published embedder."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    shape = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    shape.update(num_key_value_heads=2, max_position_embeddings=128)
    if kind == "qwen3":  # Qwen3-Embedding: the tokenizer itself appends <|endoftext|> (= pad, not eos)
        n = _save_bpe_tokenizer(
            folder,
            ["<|endoftext|>", "<|im_end|>"],
            suffix="<|endoftext|>",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
        )
        config = transformers.Qwen3Config(vocab_size=n, head_dim=8, **shape)
    elif kind == "qwen2":  # gte-Qwen2: nothing appended by the tokenizer
        n = _save_bpe_tokenizer(folder, ["<|endoftext|>"], eos_token="<|endoftext|>", pad_token="<|endoftext|>")
        config = transformers.Qwen2Config(vocab_size=n, **shape)
    elif kind == "mistral":  # e5/SFR-Mistral: BOS prefix, no pad token
        n = _save_bpe_tokenizer(folder, ["<unk>", "<s>", "</s>"], prefix="<s>", bos_token="<s>", eos_token="</s>")
        config = transformers.MistralConfig(vocab_size=n, sliding_window=None, **shape)
    elif kind == "llama":  # LLaMA-2 (BeLLM's backbone): BOS prefix, nothing appended, no pad token
        n = _save_bpe_tokenizer(folder, ["<unk>", "<s>", "</s>"], prefix="<s>", bos_token="<s>", eos_token="</s>")
        config = transformers.LlamaConfig(vocab_size=n, **shape)
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(config).eval().save_pretrained(str(folder))
    return folder


def make_xlm_roberta(folder: Path, seed: int = 0) -> Path:
    """Save a tiny random XLM-RoBERTa with a pair-aware fast tokenizer."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # XLM-R's padding_idx is 1
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + _WORDS + _PUNCT + list("abcdefghijklmnopqrstuvwxyz")))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=96,
        model_input_names=["input_ids", "attention_mask"],
    ).save_pretrained(str(folder))
    config = transformers.XLMRobertaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=100,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    transformers.XLMRobertaModel(config).eval().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llm-models")
    dirs = {kind: make_decoder(root / kind, kind) for kind in ("qwen3", "qwen2", "mistral")}
    dirs["xlm-roberta"] = make_xlm_roberta(root / "xlm-roberta")
    return dirs


@pytest.fixture(scope="module")
def qwen3(model_dirs: dict[str, Path]) -> PromptEncoder:
    encoder = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), runtime=Runtime(device="cpu")))
    assert isinstance(encoder, PromptEncoder)
    return encoder


# ----------------------------------------------------------------- family, prompts, pooling (pure)


def test_case_prompts_are_the_reference_strings() -> None:
    templates = PromptTemplates()
    assert templates.render(COLOUR, SENTENCE) == (
        "Instruct : Retrieve semantically similar texts to a given Query, under the given Condition "
        "Query : color of the dress\nCondition : A girl in an orange dress serves the ball on a tennis court."
    )
    assert templates.render(COLOUR, None) == "Instruct : Retrieve semantically similar texts Query : color of the dress"
    nv = default_templates("nvembed")
    assert nv.render(COLOUR, SENTENCE) == (
        "Retrieve semantically similar texts to a given color of the dress, under the given: "
        "A girl in an orange dress serves the ball on a tennis court."
    )
    assert nv.render(COLOUR, None) == "Retrieve semantically similar texts"
    # braces inside the user's text are data, not placeholders
    assert templates.render("{x}", "a {sentence} b").endswith("Query : {x}\nCondition : a {sentence} b")


@pytest.mark.parametrize(
    ("conditional", "unconditional", "message"),
    [
        ("Query: {condition}", CASE_UNCONDITIONAL, "needs a {sentence}"),
        (CASE_PROMPT, "Query: {condition} {sentence}", "cannot use {sentence}"),
        ("{condition} {sentence} {topic}", CASE_UNCONDITIONAL, "unknown field"),
        ("{condition {sentence}", CASE_UNCONDITIONAL, "prompt template"),
    ],
)
def test_bad_prompt_templates_are_refused(conditional: str, unconditional: str, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        PromptTemplates(conditional, unconditional)


@pytest.mark.parametrize(
    ("config", "family", "pooling"),
    [
        ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, "decoder", "last"),  # Qwen3-Embedding
        ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "decoder", "last"),  # gte-Qwen2
        ({"model_type": "mistral", "architectures": ["MistralModel"]}, "decoder", "mean"),  # SFR / e5-mistral
        ({"model_type": "llama", "architectures": ["LlamaModel"]}, "decoder", "last"),
        ({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}, "decoder", "last"),
        ({"model_type": "nvembed", "architectures": ["NVEmbedModel"]}, "nvembed", "auto"),
        ({"model_type": "something", "architectures": ["NVEmbedModel"]}, "nvembed", "auto"),
        ({"model_type": "bert", "architectures": ["BertModel"]}, "bert", "condition-mean"),
        ({"model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"]}, "bert", "condition-mean"),
        ({"model_type": "roberta"}, "bert", "condition-mean"),
        ({}, "bert", "condition-mean"),
    ],
)
def test_family_from_config(config: dict[str, object], family: str, pooling: str) -> None:
    assert detect_family(config) == family
    assert default_pooling(detect_family(config), config) == pooling


def test_family_of_saved_tiny_models(model_dirs: dict[str, Path], tiny_bert_dir: Path) -> None:
    from condsearch.base.model_sources import resolve_model

    found = {kind: detect_family(model_config(resolve_model(str(d)))) for kind, d in model_dirs.items()}
    assert found == {"qwen3": "decoder", "qwen2": "decoder", "mistral": "decoder", "xlm-roberta": "bert"}
    assert detect_family(model_config(resolve_model(str(tiny_bert_dir)))) == "bert"


def test_last_token_pool_under_either_padding() -> None:
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(last_token_pool(hidden, left), hidden[:, -1])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(last_token_pool(hidden, right), torch.stack([hidden[0, 1], hidden[1, 2]]))


def test_mean_pool_ignores_non_finite_pads() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [float("nan"), float("inf")]]])
    np.testing.assert_allclose(mean_pool(hidden, torch.tensor([[1, 1, 0]])), [[2.0, 3.0]])


# ----------------------------------------------------------------- decoder encoders


def test_qwen3_renders_case_prompts(qwen3: PromptEncoder) -> None:
    assert qwen3.render([(COLOUR, "a red dress"), (COLOUR, None)]) == [
        "Instruct : Retrieve semantically similar texts to a given Query, under the given Condition "
        "Query : color of the dress\nCondition : a red dress",
        "Instruct : Retrieve semantically similar texts Query : color of the dress",
    ]


def test_left_padding_and_last_token_index(qwen3: PromptEncoder) -> None:
    rows = qwen3.tokenize(PAIRS)
    eod = qwen3.tokenizer.get_vocab()["<|endoftext|>"]
    assert qwen3.eos_id is None  # this tokenizer appends <|endoftext|> itself, like Qwen3-Embedding's
    assert all(row[-1] == eod and row.count(eod) == 1 for row in rows)
    batch = qwen3.collate(rows)
    mask, positions = batch["attention_mask"], batch["position_ids"]
    lengths = [len(r) for r in rows]
    assert mask.sum(1).tolist() == lengths
    assert mask[:, -1].tolist() == [1] * len(rows)  # left padding: every row ends in a real token
    for i, n in enumerate(lengths):
        assert batch["input_ids"][i, -n:].tolist() == rows[i]
        assert positions[i, -n:].tolist() == list(range(n))
    hidden = torch.randn(len(rows), mask.shape[1], 4)
    np.testing.assert_array_equal(last_token_pool(hidden, mask), hidden[:, -1])


def test_eos_is_appended_when_the_tokenizer_does_not(model_dirs: dict[str, Path]) -> None:
    gte = load_encoder(EncoderSpec(str(model_dirs["qwen2"]), runtime=Runtime(device="cpu")))
    eod = gte.tokenizer.get_vocab()["<|endoftext|>"]
    assert gte.describe()["pooling"] == "last" and gte.eos_id == eod
    assert all(row[-1] == eod and row.count(eod) == 1 for row in gte.tokenize(PAIRS))


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("kind", "pooling"),
    [("qwen3", "last"), ("qwen2", "last"), ("mistral", "mean"), ("xlm-roberta", "mean"), ("xlm-roberta", "auto")],
)
def test_text_alone_equals_text_in_a_padded_batch(model_dirs: dict[str, Path], kind: str, pooling: str) -> None:
    encoder = load_encoder(EncoderSpec(str(model_dirs[kind]), pooling=pooling, runtime=Runtime(device="cpu")))
    assert encoder.describe()["pooling"] == (pooling if pooling != "auto" else "condition-mean")
    batch = encoder.encode_batch(PAIRS)
    alone = np.stack([encoder.encode_batch([p])[0] for p in PAIRS])
    assert batch.shape == (len(PAIRS), 32) and np.isfinite(batch).all()
    assert_rows_close(batch, alone, pooled_tolerance(encoder, PAIRS))
    assert not np.allclose(batch[0], batch[1], atol=1e-4)


@pytest.mark.numerics
def test_prompted_bert_mean_pooling_is_batch_invariant(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), pooling="mean", runtime=Runtime(device="cpu")))
    assert isinstance(encoder, PromptEncoder) and encoder.padding_side == "right"
    alone = np.stack([encoder.encode_batch([p])[0] for p in PAIRS])
    assert_rows_close(encoder.encode_batch(PAIRS), alone, pooled_tolerance(encoder, PAIRS))


@pytest.mark.numerics
def test_case_vectors_are_conditional_minus_unconditional(qwen3: PromptEncoder) -> None:
    sentences = ["a red dress", "two men play soccer", SENTENCE]
    case = qwen3.encode(sentences, COLOUR, batch_size=2)
    assert case.shape == (3, 32) and case.dtype == np.float32
    cond = qwen3.encode_pairs([(COLOUR, s) for s in sentences])
    base = qwen3.encode_pairs([(COLOUR, None)])
    assert cond.shape == (3, 32) and base.shape == (1, 32)
    assert_rows_close(case, cond - base, case_tolerance(qwen3, sentences, COLOUR))  # batches of 2 and 1, not 3


def test_truncation_is_counted_and_keeps_the_final_token(model_dirs: dict[str, Path]) -> None:
    encoder = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), max_length=36, runtime=Runtime(device="cpu")))
    long_sentence = " ".join(["a girl in an orange dress"] * 10)
    [row] = encoder.tokenize([(COLOUR, long_sentence)])
    assert len(row) == 36 and row[-1] == encoder.tokenizer.get_vocab()["<|endoftext|>"]
    out = encoder.encode([long_sentence, "a red dress"], COLOUR)
    assert np.isfinite(out).all()
    assert encoder.stats.n_truncated == 2  # once by tokenize above, once by encode
    notice = encoder.report_truncation()
    assert notice is not None and "2 input(s)" in notice and "a girl in an orange dress" in notice
    assert encoder.report_truncation() is None
    gte = load_encoder(EncoderSpec(str(model_dirs["qwen2"]), max_length=36, runtime=Runtime(device="cpu")))
    [row] = gte.tokenize([(COLOUR, long_sentence)])
    assert len(row) == 36 and row[-1] == gte.eos_id  # room was kept for the appended EOS


def test_describe_records_settings_and_rebuilds(model_dirs: dict[str, Path]) -> None:
    template = "Query: {condition}\nGiven: {sentence}"
    encoder = load_encoder(
        EncoderSpec(
            str(model_dirs["mistral"]),
            pooling="last",
            prompt_template=template,
            max_length=40,
            runtime=Runtime(device="cpu"),
        )
    )
    info = encoder.describe()
    assert info["family"] == "decoder" and info["pooling"] == "last" and info["dtype"] == "float32"
    assert info["prompt_template"] == template and info["unconditional_template"] == CASE_UNCONDITIONAL
    assert info["max_length"] == 40 and info["dim"] == 32
    spec = EncoderSpec.recorded(info, "case", "none").with_runtime(Runtime(device="cpu"))
    again = load_vectorizer(spec).encoder  # what a query loads from the manifest
    assert again.describe() == info
    np.testing.assert_allclose(again.encode_batch(PAIRS), encoder.encode_batch(PAIRS), atol=1e-6)


def test_bert_describe_is_unchanged(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    assert set(encoder.describe()) == {"model_id", "revision", "dim", "pooling", "max_length"}
    assert encoder.describe()["pooling"] == "condition-mean"
    spec = EncoderSpec.recorded(encoder.describe(), "case", "none")
    assert (spec.pooling, spec.max_length, spec.dtype, spec.quantize) == (
        "condition-mean",
        encoder.max_length,
        "auto",
        "none",
    )


def test_bfloat16_on_cpu_is_close_to_float32(model_dirs: dict[str, Path], qwen3: PromptEncoder) -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    half = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), dtype="bfloat16", runtime=Runtime(device="cpu")))
    assert half.describe()["dtype"] == "bfloat16"
    a, b = half.encode_batch(PAIRS), qwen3.encode_batch(PAIRS)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.98


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("qwen3", {"pooling": "condition-mean"}, "condition-mean pooling needs a BERT-style"),
        ("xlm-roberta", {"prompt_template": "{condition} {sentence}"}, "need --pooling last or mean"),
        ("qwen3", {"prompt_template": "{sentence} only"}, "need a {condition}"),
        ("qwen3", {"pooling": "max"}, "unknown pooling"),
        ("qwen3", {"dtype": "int8"}, "unknown dtype"),
    ],
)
def test_inconsistent_options_are_refused(
    model_dirs: dict[str, Path], kind: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        load_encoder(EncoderSpec(str(model_dirs[kind]), **options, runtime=Runtime(device="cpu")))  # type: ignore[arg-type]


# ----------------------------------------------------------------- several devices, OOM back-off


def test_split_evenly() -> None:
    assert split_evenly(5, 2) == [(0, 3), (3, 5)]
    assert split_evenly(1, 3) == [(0, 1)]
    assert split_evenly(6, 3) == [(0, 2), (2, 4), (4, 6)]


@pytest.mark.numerics
def test_replicas_split_a_batch_like_one_device(model_dirs: dict[str, Path], qwen3: PromptEncoder) -> None:
    both = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), max_length=36, runtime=Runtime(device="cpu,cpu")))
    assert isinstance(both, ReplicatedEncoder) and len(both.replicas) == 2
    assert both.describe() == {**qwen3.describe(), "max_length": 36}
    long_sentence = " ".join(["a girl in an orange dress"] * 10)
    pairs = [*PAIRS, (COLOUR, long_sentence)]
    single = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), max_length=36, runtime=Runtime(device="cpu")))
    assert_rows_close(both.encode_batch(pairs), single.encode_batch(pairs), pooled_tolerance(single, pairs))
    assert both.stats.n_truncated == 2 and all(r.stats.n_truncated == 0 for r in both.replicas)
    assert "truncated" in (both.report_truncation() or "")


def test_oom_halves_the_batch_and_remembers() -> None:
    calls: list[int] = []

    def run(chunk: Sequence[int]) -> np.ndarray:
        calls.append(len(chunk))
        if len(chunk) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return np.array([[float(x)] for x in chunk], dtype=np.float32)

    backoff = OomBackoff()
    out = backoff.run(run, list(range(7)))
    np.testing.assert_array_equal(out[:, 0], np.arange(7))
    assert backoff.limit == 3 and calls == [7, 3, 3, 1]
    calls.clear()
    backoff.run(run, list(range(4)))
    assert calls == [3, 1]  # starts at the size that fitted

    def always(chunk: Sequence[int]) -> np.ndarray:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(ModelError, match="out of GPU memory on a single input"):
        OomBackoff().run(always, [1, 2])


# ----------------------------------------------------------------- NV-Embed


def _nvembed_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "nv"
    folder.mkdir()
    config = {"model_type": "nvembed", "architectures": ["NVEmbedModel"], "latent_attention_config": {"hidden_dim": 8}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_nvembed_needs_trust_remote_code(tmp_path: Path) -> None:
    from condsearch.cli import main

    folder = _nvembed_folder(tmp_path)
    with pytest.raises(ModelError, match="NV-Embed model, which runs its own code: pass --trust-remote-code"):
        load_encoder(EncoderSpec(str(folder), runtime=Runtime(device="cpu")))
    corpus = tmp_path / "corpus.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a red dress"]}), corpus)
    result = CliRunner().invoke(
        main, ["index", str(corpus), "-c", COLOUR, "--model", str(folder), "--index-dir", str(tmp_path / "ix")]
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].endswith("pass --trust-remote-code")
    with pytest.raises(ModelError, match="latent attention"):
        load_encoder(EncoderSpec(str(folder), pooling="mean", runtime=Runtime(device="cpu", trust_remote_code=True)))


class _FakeNVEmbed(torch.nn.Module):
    """Stands in for NV-Embed's remote code: records encode() calls, returns hashed vectors."""

    def __init__(self, tokenizer: object) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.calls: list[tuple[list[str], str, int]] = []
        self.weight = torch.nn.Parameter(torch.zeros(1))

    @staticmethod
    def vector(instruction: str, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(f"{instruction}|{text}".encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(8).astype(np.float32)

    def encode(self, prompts: list[str], instruction: str = "", max_length: int = 4096) -> torch.Tensor:
        self.calls.append((list(prompts), instruction, max_length))
        return torch.from_numpy(np.stack([self.vector(instruction, p) for p in prompts]))


def test_nvembed_encodes_through_its_own_encode(
    tmp_path: Path, model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    import condsearch.model.encoders.nvembed as nvembed

    fake = _FakeNVEmbed(AutoTokenizer.from_pretrained(str(model_dirs["mistral"])))
    monkeypatch.setattr(nvembed, "load_remote_model", lambda location, dtype: fake)
    encoder = load_encoder(
        EncoderSpec(
            str(_nvembed_folder(tmp_path)), max_length=32, runtime=Runtime(device="cpu", trust_remote_code=True)
        )
    )
    assert encoder.dim == 8 and encoder.describe()["pooling"] == "latent-attention"
    long_sentence = " ".join(["a girl in an orange dress"] * 5)
    out = encoder.encode(["a red dress", long_sentence], [COLOUR, "the sport"])
    inst_red = "Retrieve semantically similar texts to a given color of the dress, under the given: a red dress"
    inst_long = f"Retrieve semantically similar texts to a given the sport, under the given: {long_sentence}"
    calls = sorted(fake.calls, key=lambda c: c[1])
    assert calls == sorted(
        [
            ([COLOUR, "the sport"], "Retrieve semantically similar texts", 32),  # both bare instructions at once
            ([COLOUR], inst_red, 32),
            (["the sport"], inst_long, 32),
        ],
        key=lambda c: c[1],
    )
    bare = "Retrieve semantically similar texts"
    expected = [
        _FakeNVEmbed.vector(inst_red, COLOUR) - _FakeNVEmbed.vector(bare, COLOUR),
        _FakeNVEmbed.vector(inst_long, "the sport") - _FakeNVEmbed.vector(bare, "the sport"),
    ]
    np.testing.assert_allclose(out, np.stack(expected), atol=1e-6)
    assert encoder.stats.n_truncated == 1  # the long instruction exceeds 32 tokens and is reported


# ----------------------------------------------------------------- head on 4096-d, GPU-less search path


def test_head_trains_on_4096_d_features() -> None:
    rng = np.random.default_rng(0)
    n, d = 512, 4096
    signal = rng.standard_normal((n, 8)).astype(np.float32)
    mix = rng.standard_normal((8, d)).astype(np.float32)
    x1 = signal @ mix + 0.1 * rng.standard_normal((n, d)).astype(np.float32)
    x2 = (signal + 0.3 * rng.standard_normal((n, 8)).astype(np.float32)) @ mix
    labels = np.clip(1 + 4 * rng.random(n), 1, 5).astype(np.float32)
    features = PairFeatures(x1, x2, labels)
    head, history = fit_head(features, HeadTrainConfig(dim=512, epochs=3, batch_size=128), dev=features)
    assert head.config.input_dim == 4096 and head.config.dim == 512
    assert head.project(x1[:3]).shape == (3, 512)
    assert len(history) == 3 and history[-1]["loss"] < history[0]["loss"]
    assert np.isfinite(evaluate_head(head, features)["spearman"])


@pytest.mark.numerics
def test_torch_search_matches_exact_search() -> None:
    rng = np.random.default_rng(1)
    corpus, queries = normalize(rng.standard_normal((40, 16))), normalize(rng.standard_normal((5, 16)))
    index = torch_flat_index(build_index(corpus), "cpu")
    assert index is not None and index.ntotal == 40
    got, want = search(index, queries, 6), exact_search(corpus, queries, 6)
    assert_same_ranking((got.scores, got.ids), (want.scores, want.ids), score_tolerance(16))
    padded = search(index, queries, 45)  # past the corpus size, like FAISS
    assert (padded.ids[:, 40:] == -1).all() and (padded.ids[:, :40] >= 0).all()
    assert torch_flat_index(build_index(corpus, "HNSW8"), "cpu") is None


# ----------------------------------------------------------------- CLI, manifest, head compatibility


def test_cli_index_and_query_with_a_qwen3_folder(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from condsearch.cli import main
    from condsearch.store.folder import IndexStore

    texts = ["a red dress", "two men play soccer on a grass field", SENTENCE, "a dog in the park"]
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(4)], "text": texts}), corpus)
    runner = CliRunner()
    folder = str(model_dirs["qwen3"])
    for name, extra in (
        ("default", []),
        ("custom", ["--pooling", "mean", "--prompt-template", "Query: {condition}\\nText: {sentence}"]),
    ):
        index_dir = str(tmp_path / name)
        args = ["index", str(corpus), "-c", COLOUR, "--model", folder, "--head", "none", "--device", "cpu"]
        result = runner.invoke(main, [*args, "--index-dir", index_dir, "--json", *extra])
        assert result.exit_code == 0, result.output
        row = json.loads(result.stdout.strip().splitlines()[-1])
        manifest = IndexStore(index_dir).read_manifest(row["index"])
        assert manifest.model_id == str(Path(folder).resolve()) and manifest.dim == 32
        assert manifest.encoder["family"] == "decoder" and manifest.encoder["dtype"] == "float32"
        if name == "default":
            assert manifest.encoder["pooling"] == "last" and manifest.encoder["prompt_template"] == CASE_PROMPT
        else:
            assert manifest.encoder["pooling"] == "mean"
            assert manifest.encoder["prompt_template"] == "Query: {condition}\nText: {sentence}"
        # query rebuilds the same encoder from the manifest: a corpus text finds itself with cosine 1
        query = ["query", "a red dress", "-c", COLOUR, "-k", "2", "--index-dir", index_dir, "--device", "cpu", "--json"]
        result = runner.invoke(main, query)
        assert result.exit_code == 0, result.output
        hits = json.loads(result.stdout.strip().splitlines()[-1])["results"]
        assert hits[0]["id"] == "s0" and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_cli_train_records_the_prompted_encoder(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from condsearch.cli import main

    rows = [
        ("a girl in a red dress", "a woman in a red dress", COLOUR, 5),
        ("a girl in a red dress", "a man in a blue shirt", COLOUR, 1),
        ("two men play soccer", "a boy plays soccer", "the sport", 5),
        ("two men play soccer", "a girl plays tennis", "the sport", 2),
    ]
    train_csv = tmp_path / "train.csv"
    train_csv.write_text("sentence1,sentence2,condition,label\n" + "".join(f"{a},{b},{c},{y}\n" for a, b, c, y in rows))
    head_dir = tmp_path / "head"
    model = str(model_dirs["qwen2"])
    runner = CliRunner()
    args = ["train", str(train_csv), "--out", str(head_dir), "--dim", "4", "--epochs", "2", "--model", model]
    result = runner.invoke(main, [*args, "--pooling", "mean", "--max-length", "64", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    meta = json.loads((head_dir / "head.json").read_text())
    assert meta["encoder_pooling"] == "mean" and meta["input_dim"] == 32
    assert meta["training"]["encoder"]["prompt_template"] == CASE_PROMPT
    assert meta["training"]["encoder"]["max_length"] == 64
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": ["a red dress", "two men play soccer"]}), corpus)
    index = ["index", str(corpus), "-c", COLOUR, "--model", model, "--head", str(head_dir), "--device", "cpu"]
    index += ["--index-dir", str(tmp_path / "ix")]
    result = runner.invoke(main, index)  # default pooling for gte-Qwen2 is last: not what the head saw
    assert result.exit_code == 1 and "trained on mean pooling, not last" in result.output
    assert runner.invoke(main, [*index, "--pooling", "mean"]).exit_code == 0


def test_head_trained_on_other_pooling_is_refused(tiny_encoder: object, tmp_path: Path) -> None:
    from condsearch.model.vectorizer import resolve_head

    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=4, encoder_pooling="last")), tmp_path / "head")
    with pytest.raises(ModelError, match="trained on last pooling, not condition-mean"):
        resolve_head(str(tmp_path / "head"), tiny_encoder)  # type: ignore[arg-type]


# ----------------------------------------------------------------- CUDA only


@pytest.mark.gpu
@needs_cuda
def test_cuda_bfloat16_is_close_to_float32(model_dirs: dict[str, Path]) -> None:
    auto = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), runtime=Runtime(device="cuda:0")))
    assert auto.describe()["dtype"] == ("bfloat16" if torch.cuda.is_bf16_supported() else "float32")
    half = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), dtype="bfloat16", runtime=Runtime(device="cuda:0")))
    full = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), dtype="float32", runtime=Runtime(device="cuda:0")))
    a, b = half.encode_batch(PAIRS), full.encode_batch(PAIRS)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.98
    np.testing.assert_allclose(
        half.encode_batch(PAIRS), np.stack([half.encode_batch([p])[0] for p in PAIRS]), atol=2e-2
    )


@pytest.mark.gpu
@needs_cuda
def test_cuda_devices_split_equals_one_device(model_dirs: dict[str, Path]) -> None:
    n = torch.cuda.device_count()
    spec = ",".join(f"cuda:{i % n}" for i in range(2))
    both = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), dtype="float32", runtime=Runtime(device=spec)))
    one = load_encoder(EncoderSpec(str(model_dirs["qwen3"]), dtype="float32", runtime=Runtime(device="cuda:0")))
    assert_rows_close(both.encode_batch(PAIRS), one.encode_batch(PAIRS), pooled_tolerance(one, PAIRS))


@pytest.mark.gpu
@needs_cuda
def test_cuda_torch_search_matches_exact() -> None:
    rng = np.random.default_rng(2)
    corpus, queries = normalize(rng.standard_normal((300, 32))), normalize(rng.standard_normal((7, 32)))
    index = torch_flat_index(build_index(corpus), "cuda")
    assert index is not None
    got, want = search(index, queries, 5), exact_search(corpus, queries, 5)
    assert_same_ranking((got.scores, got.ids), (want.scores, want.ids), score_tolerance(32))
