"""BeLLM: bidirectional top layers for decoder embedders, its preset, is_causal: false configs (tiny Qwen3 / LLaMA)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.errors import ModelError
from condsearch.model.encoders import DecoderAttention, Encoder, load_encoder
from condsearch.model.encoders.bidirectional import decoder_layers, make_bidirectional
from condsearch.model.encoders.decoder import PromptEncoder
from condsearch.model.encoders.family import BELLM_PROMPT, BELLM_UNCONDITIONAL, PRESETS
from condsearch.model.encoders.pooling import last_token_pool
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from tests.model.encoders.test_llm_encoders import COLOUR, PAIRS, make_decoder
from tests.tolerance import assert_rows_close, pooled_tolerance

KINDS = ("qwen3", "llama")


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bellm-models")
    dirs = {kind: make_decoder(root / kind, kind) for kind in (*KINDS, "qwen2")}
    # gte-Qwen2-7B-instruct's config says is_causal: false; a copy of the tiny gte-Qwen2 that says so too
    both_ways = root / "qwen2-bidirectional"
    shutil.copytree(dirs["qwen2"], both_ways)
    config = json.loads((both_ways / "config.json").read_text())
    (both_ways / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    dirs["qwen2-bidirectional"] = both_ways
    return dirs


def _encoder(folder: Path, **options: object) -> PromptEncoder:
    encoder = load_encoder(EncoderSpec(str(folder), **options, runtime=Runtime(device="cpu")))  # type: ignore[arg-type]
    assert isinstance(encoder, PromptEncoder)
    return encoder


def _rebuilt(described: dict[str, object]) -> Encoder:
    """Return the encoder a manifest's record loads again (as a query does)."""
    from condsearch.model.vectorizer import load_vectorizer

    spec = EncoderSpec.recorded(described, "case", "none").with_runtime(Runtime(device="cpu"))
    return load_vectorizer(spec).encoder  # type: ignore[return-value]


def _states(encoder: PromptEncoder, rows: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """Return every layer's hidden states of the collated rows: embeddings first, the final output last."""
    batch = encoder.collate(rows)
    with torch.inference_mode():
        return encoder.model(**batch, output_hidden_states=True, use_cache=False).hidden_states


def _with_a_later_token_changed(encoder: PromptEncoder) -> tuple[list[list[int]], int]:
    """Return two same-length token rows that differ only in one token near the end, and that token's index."""
    [row] = encoder.tokenize([(COLOUR, "a girl in a red dress")])
    at = len(row) - 2  # the last word before the end (or the prompt's last tokens)
    other = list(row)
    other[at] = row[at - 1] if row[at - 1] != row[at] else row[at - 2]
    return [list(row), other], at


# ----------------------------------------------------------------- N = 0 is today's causal encoder


@pytest.mark.parametrize("kind", KINDS)
def test_zero_bidirectional_layers_is_the_causal_encoder(decoder_dirs: dict[str, Path], kind: str) -> None:
    default = _encoder(decoder_dirs[kind])
    zero = _encoder(decoder_dirs[kind], bidirectional_layers=0)
    assert default.bidirectional_layers == zero.bidirectional_layers == DecoderAttention().bidirectional_layers == 0
    assert "bidirectional_layers" not in zero.describe()  # causal records nothing: old manifests and caches match
    assert zero.describe() == default.describe()
    # the plain transformers forward pass with the same inputs, pooled by hand, is bit-identical
    rows = zero.tokenize(PAIRS)
    batch = zero.collate(rows)
    with torch.inference_mode():
        hidden = zero.model(**batch, use_cache=False).last_hidden_state
    reference = last_token_pool(hidden, batch["attention_mask"]).numpy()
    np.testing.assert_array_equal(zero.encode_batch(PAIRS), reference)
    np.testing.assert_array_equal(zero.encode_batch(PAIRS), default.encode_batch(PAIRS))
    # switching the top layers to bidirectional and back leaves the causal model exactly as it was
    undo = make_bidirectional(zero.model, 2)
    assert not np.allclose(zero.encode_batch(PAIRS), reference, atol=1e-4)
    undo()
    np.testing.assert_array_equal(zero.encode_batch(PAIRS), reference)


# ----------------------------------------------------------------- N = 1: only the top layer sees later tokens


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1, 2])
def test_a_later_token_reaches_earlier_states_only_in_the_top_n_layers(
    decoder_dirs: dict[str, Path], kind: str, n: int
) -> None:
    encoder = _encoder(decoder_dirs[kind], bidirectional_layers=n)
    n_layers = len(decoder_layers(encoder.model))
    assert n_layers == 2
    rows, at = _with_a_later_token_changed(encoder)
    states = _states(encoder, rows)
    assert len(states) == n_layers + 1  # the embeddings, then each layer's output
    for depth, layer_states in enumerate(states):
        earlier = (layer_states[0, :at] - layer_states[1, :at]).abs().max().item()
        layer = depth - 1  # states[depth] is the output of layer depth - 1
        if layer >= n_layers - n:  # a bidirectional layer, or one above it
            assert earlier > 1e-3, (depth, earlier)
        else:  # the embeddings and every causal layer below: untouched by a later token
            assert earlier == 0.0, (depth, earlier)
    # the changed token itself and what follows differ in any case
    assert (states[-1][0, at:] - states[-1][1, at:]).abs().max().item() > 1e-3


@pytest.mark.numerics
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pooling", ["last", "prompt-last"])
def test_the_last_token_cannot_tell_a_bidirectional_top_layer(
    decoder_dirs: dict[str, Path], kind: str, pooling: str
) -> None:
    # With only the top layer bidirectional, the last token's state is the causal one: it attended to
    # every token already, and the layers below are untouched. So the bellm preset pools the mean.
    causal = _encoder(decoder_dirs[kind], pooling=pooling)
    top = _encoder(decoder_dirs[kind], pooling=pooling, bidirectional_layers=1)
    # the same state through another attention mask (and so maybe another kernel): equal up to rounding
    assert_rows_close(top.encode_batch(PAIRS), causal.encode_batch(PAIRS), pooled_tolerance(causal, PAIRS))
    mean_causal = _encoder(decoder_dirs[kind], pooling="mean")
    mean_top = _encoder(decoder_dirs[kind], pooling="mean", bidirectional_layers=1)
    assert not np.allclose(mean_top.encode_batch(PAIRS), mean_causal.encode_batch(PAIRS), atol=1e-4)


def test_bidirectional_layers_out_of_range_are_refused(decoder_dirs: dict[str, Path]) -> None:
    with pytest.raises(ModelError, match="has 2 layers"):
        _encoder(decoder_dirs["qwen3"], bidirectional_layers=3)
    with pytest.raises(ModelError, match="0 or more"):
        DecoderAttention(-1)


# ----------------------------------------------------------------- left padding stays right


@pytest.mark.numerics
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "options",
    [
        {"bidirectional_layers": 1, "pooling": "mean"},
        {"bidirectional_layers": 2},
        {"bidirectional_layers": 2, "pooling": "prompt-last"},
        {"preset": "bellm"},
    ],
)
def test_text_alone_equals_text_in_a_left_padded_batch(
    decoder_dirs: dict[str, Path], kind: str, options: dict[str, object]
) -> None:
    encoder = _encoder(decoder_dirs[kind], **options)
    assert encoder.padding_side == "left"
    rows = encoder.tokenize(PAIRS)
    assert len({len(r) for r in rows}) > 1  # the batch is really padded
    batch = encoder.encode_batch(PAIRS)
    alone = np.stack([encoder.encode_batch([p])[0] for p in PAIRS])
    assert np.isfinite(batch).all()
    assert_rows_close(batch, alone, pooled_tolerance(encoder, PAIRS))
    # and the vectors really are other than the causal encoder's
    causal = _encoder(decoder_dirs[kind], **{**options, "bidirectional_layers": 0})
    assert not np.allclose(batch, causal.encode_batch(PAIRS), atol=1e-4)


@pytest.mark.numerics
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_implementations_agree(decoder_dirs: dict[str, Path], impl: str) -> None:
    import transformers

    reference = _encoder(decoder_dirs["qwen3"], bidirectional_layers=1)
    model = transformers.AutoModel.from_pretrained(str(decoder_dirs["qwen3"]), attn_implementation=impl).eval()
    make_bidirectional(model, 1)
    batch = reference.collate(reference.tokenize(PAIRS))
    with torch.inference_mode():
        hidden = model(**batch, use_cache=False).last_hidden_state
    got = last_token_pool(hidden, batch["attention_mask"]).numpy()
    assert_rows_close(got, reference.encode_batch(PAIRS), pooled_tolerance(reference, PAIRS))


# ----------------------------------------------------------------- is_causal: false (gte-Qwen2)


@pytest.mark.numerics
def test_a_config_with_is_causal_false_attends_both_ways_in_every_layer(decoder_dirs: dict[str, Path]) -> None:
    both_ways = _encoder(decoder_dirs["qwen2-bidirectional"])
    assert both_ways.bidirectional_layers == 2 and both_ways.describe()["bidirectional_layers"] == 2
    # the same weights with a causal config, made bidirectional in all layers by hand, give the same vectors
    causal_config = _encoder(decoder_dirs["qwen2"])
    assert causal_config.bidirectional_layers == 0
    all_layers = _encoder(decoder_dirs["qwen2"], bidirectional_layers=2)
    tolerance = pooled_tolerance(both_ways, PAIRS)
    assert_rows_close(both_ways.encode_batch(PAIRS), all_layers.encode_batch(PAIRS), tolerance)
    assert not np.allclose(both_ways.encode_batch(PAIRS), causal_config.encode_batch(PAIRS), atol=1e-4)
    # even the first layer's earlier states see a later token
    rows, at = _with_a_later_token_changed(both_ways)
    first_layer = _states(both_ways, rows)[1]
    assert (first_layer[0, :at] - first_layer[1, :at]).abs().max().item() > 1e-3
    # a single text (no padding, no mask) is not silently causal
    alone = np.stack([both_ways.encode_batch([p])[0] for p in PAIRS])
    assert_rows_close(alone, both_ways.encode_batch(PAIRS), tolerance)
    # rebuilt from its record, it is the same encoder; a partial request contradicts the config
    again = _rebuilt(both_ways.describe())
    assert again.describe() == both_ways.describe()
    with pytest.raises(ModelError, match="is_causal: false in its config"):
        _encoder(decoder_dirs["qwen2-bidirectional"], bidirectional_layers=1)


def test_bidirectional_layers_are_refused_for_encoders_that_attend_both_ways(tiny_bert_dir: Path) -> None:
    with pytest.raises(ModelError, match="applies to decoder embedders"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), bidirectional_layers=1, runtime=Runtime(device="cpu")))
    with pytest.raises(ModelError, match="applies to decoder embedders"):
        load_encoder(
            EncoderSpec(str(tiny_bert_dir), pooling="mean", bidirectional_layers=1, runtime=Runtime(device="cpu"))
        )
    with pytest.raises(ModelError, match="applies to decoder embedders"):
        load_encoder(EncoderSpec(str(tiny_bert_dir), preset="bellm", runtime=Runtime(device="cpu")))


# ----------------------------------------------------------------- the bellm preset


def test_bellm_preset_prompt_pooling_and_layers(decoder_dirs: dict[str, Path]) -> None:
    preset = PRESETS["bellm"]
    assert preset.pooling == "mean" and preset.attention.bidirectional_layers == 1
    encoder = _encoder(decoder_dirs["llama"], preset="bellm")
    assert encoder.render([(COLOUR, "a red dress"), (COLOUR, None)]) == [
        'Given the context color of the dress, summarize the sentence a red dress in one word:"',
        'Given the context color of the dress, summarize the sentence in one word:"',
    ]
    info = encoder.describe()
    assert info["pooling"] == "mean" and info["bidirectional_layers"] == 1
    assert info["prompt_template"] == BELLM_PROMPT and info["unconditional_template"] == BELLM_UNCONDITIONAL
    # LLaMA: BOS first, the prompt's closing quote last, nothing appended after it
    quote = encoder.tokenizer('"', add_special_tokens=False)["input_ids"][-1]
    for row in encoder.tokenize(PAIRS):
        assert row[0] == encoder.tokenizer.bos_token_id and row[-1] == quote
    # rebuilt from the record (what a query does from a manifest): same settings, same vectors
    again = _rebuilt(info)
    assert again.describe() == info
    np.testing.assert_array_equal(again.encode_batch(PAIRS), encoder.encode_batch(PAIRS))


def test_prompt_last_strips_qwen3s_end_token_and_the_preset_yields_to_explicit_flags(
    decoder_dirs: dict[str, Path],
) -> None:
    encoder = _encoder(decoder_dirs["qwen3"], preset="bellm", pooling="prompt-last")
    eod = encoder.tokenizer.get_vocab()["<|endoftext|>"]
    assert all(eod not in row for row in encoder.tokenize(PAIRS))  # the prompt's own last token is pooled
    assert encoder.describe()["pooling"] == "prompt-last" and encoder.bidirectional_layers == 1
    last = _encoder(decoder_dirs["qwen3"], preset="bellm", pooling="last", bidirectional_layers=0)
    info = last.describe()
    assert info["pooling"] == "last" and "bidirectional_layers" not in info
    assert info["prompt_template"] == BELLM_PROMPT
    assert all(row[-1] == eod for row in last.tokenize(PAIRS))
    with pytest.raises(ModelError, match="unknown preset"):
        _encoder(decoder_dirs["qwen3"], preset="angle")


# ----------------------------------------------------------------- CLI: index, query, manifest


def _corpus(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["a red dress", "two men play soccer on a grass field", "a girl in an orange dress", "a dog in the park"]
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(len(texts))], "text": texts}), corpus)
    return corpus


@pytest.mark.parametrize("flags", [["--bidirectional-layers", "1"], ["--preset", "bellm"]])
def test_cli_index_and_query_with_bidirectional_layers(
    decoder_dirs: dict[str, Path], tmp_path: Path, flags: list[str]
) -> None:
    from condsearch.cli import main
    from condsearch.store.folder import IndexStore

    runner = CliRunner()
    index_dir = str(tmp_path / "ix")
    args = ["index", str(_corpus(tmp_path)), "-c", COLOUR, "--model", str(decoder_dirs["qwen3"]), "--head", "none"]
    result = runner.invoke(main, [*args, "--device", "cpu", "--index-dir", index_dir, "--json", *flags])
    assert result.exit_code == 0, result.output
    name = json.loads(result.stdout.strip().splitlines()[-1])["index"]
    manifest = IndexStore(index_dir).read_manifest(name)
    assert manifest.encoder["bidirectional_layers"] == 1 and manifest.encoder["family"] == "decoder"
    # a preset is recorded as the settings it chose, which is what query rebuilds from
    bellm = "--preset" in flags
    assert manifest.encoder["pooling"] == ("mean" if bellm else "last")
    assert (manifest.encoder["prompt_template"] == BELLM_PROMPT) is bellm
    assert (manifest.encoder["unconditional_template"] == BELLM_UNCONDITIONAL) is bellm
    # query rebuilds the same (bidirectional) encoder from the manifest: a corpus text finds itself at cosine 1
    query = ["query", "a red dress", "-c", COLOUR, "-k", "2", "--index-dir", index_dir, "--device", "cpu", "--json"]
    result = runner.invoke(main, query)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.stdout.strip().splitlines()[-1])["results"]
    assert hits[0]["id"] == "s0" and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_cli_refuses_bidirectional_layers_where_they_do_not_apply(tmp_path: Path, tiny_bert_dir: Path) -> None:
    from condsearch.cli import main

    runner = CliRunner()
    base = ["index", str(_corpus(tmp_path)), "-c", COLOUR, "--device", "cpu", "--index-dir", str(tmp_path / "ix")]
    result = runner.invoke(main, [*base, "--mode", "csr", "--bidirectional-layers", "1"])
    assert result.exit_code == 2 and "--mode case" in result.output
    result = runner.invoke(
        main, [*base, "--model", str(tiny_bert_dir), "--head", "none", "--bidirectional-layers", "1"]
    )
    assert result.exit_code == 1 and "applies to decoder embedders" in result.output.strip().splitlines()[-1]
    result = runner.invoke(main, [*base, "--bidirectional-layers", "-1"])
    assert result.exit_code == 2


# ----------------------------------------------------------------- fine-tuning: LoRA on bidirectional top layers


def _train_csv(tmp_path: Path) -> Path:
    rows = [
        ("a girl in a red dress", "a woman in a red dress", COLOUR, 5),
        ("a girl in a red dress", "a woman in a red dress", "the sport", 2),
        ("two men play soccer", "a boy plays soccer", "the sport", 5),
        ("two men play soccer", "a boy plays soccer", COLOUR, 1),
        ("a man in a green hat", "a boy in a green shirt", COLOUR, 4),
        ("a man in a green hat", "a boy in a green shirt", "the sport", 1),
    ]
    path = tmp_path / "train.csv"
    path.write_text("sentence1,sentence2,condition,label\n" + "".join(f"{a},{b},{c},{y}\n" for a, b, c, y in rows))
    return path


def test_lora_fine_tuning_of_a_decoder_with_a_bidirectional_top_layer(
    decoder_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from condsearch.cli import main
    from condsearch.model.artifacts.adapters import read_adapter
    from condsearch.model.vectorizer import load_vectorizer

    model = str(decoder_dirs["qwen3"])
    out = tmp_path / "bellm-lora"
    runner = CliRunner()
    train = ["train", "lora", str(_train_csv(tmp_path)), "--dev", str(_train_csv(tmp_path)), "--out", str(out)]
    # one pair a step: the linear schedule's first step warms up from a rate of 0, the next two train
    train += ["--model", model, "--lora-rank", "2", "--epochs", "1", "--train-batch-size", "2", "--device", "cpu"]
    train += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--preset", "bellm", "--loss", "mse+cmse", "--json"]
    result = runner.invoke(main, train)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["config"]["losses"] == {"mse": 1.0, "cmse": 1.0} and np.isfinite(summary["dev_spearman"])
    meta = read_adapter(out).meta
    assert meta["encoder_pooling"] == "mean"
    assert meta["encoder"] == {
        "prompt_template": BELLM_PROMPT,
        "unconditional_template": BELLM_UNCONDITIONAL,
        "bidirectional_layers": 1,
    }
    # --head OUT alone rebuilds the encoder the adapter was trained on (prompts, pooling, bidirectional layer)
    vec = load_vectorizer(EncoderSpec(model, head=str(out), runtime=Runtime(device="cpu")))
    described = vec.encoder.describe()
    assert described["bidirectional_layers"] == 1 and described["pooling"] == "mean"
    assert described["adapter_checksum"] == summary["adapter_checksum"]
    plain = load_vectorizer(EncoderSpec(model, head="none", preset="bellm", runtime=Runtime(device="cpu")))
    assert not np.allclose(vec.encode(["a red dress"], COLOUR), plain.encode(["a red dress"], COLOUR), atol=1e-5)
    # another attention than the adapter was trained with is refused
    with pytest.raises(ModelError, match="bidirectional layers 1, not 0"):
        load_vectorizer(EncoderSpec(model, head=str(out), bidirectional_layers=0, runtime=Runtime(device="cpu")))
    # full fine-tuning of a decoder is refused (LoRA only)
    full = ["train", "full", str(_train_csv(tmp_path)), "--out", str(tmp_path / "bellm-full"), "--model", model]
    result = runner.invoke(main, [*full, "--checkpoint-dir", str(tmp_path / "ckpt-full"), "--device", "cpu"])
    assert result.exit_code == 1 and "train lora" in result.output


def test_query_refuses_an_index_its_model_no_longer_rebuilds(decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    from condsearch.cli import main
    from condsearch.store.folder import MANIFEST, IndexStore

    runner = CliRunner()
    index_dir = tmp_path / "ix"
    model = str(decoder_dirs["qwen2-bidirectional"])
    args = ["index", str(_corpus(tmp_path)), "-c", COLOUR, "--model", model, "--head", "none", "--device", "cpu"]
    result = runner.invoke(main, [*args, "--index-dir", str(index_dir), "--json"])
    assert result.exit_code == 0, result.output
    name = json.loads(result.stdout.strip().splitlines()[-1])["index"]
    assert IndexStore(index_dir).read_manifest(name).encoder["bidirectional_layers"] == 2  # is_causal: false
    query = ["query", "a red dress", "-c", COLOUR, "--index-dir", str(index_dir), "--device", "cpu"]
    assert runner.invoke(main, query).exit_code == 0
    # an index of this model built causal (as before is_causal: false was honoured) records no layers
    path = index_dir / name / MANIFEST
    manifest = json.loads(path.read_text())
    del manifest["encoder"]["bidirectional_layers"]
    path.write_text(json.dumps(manifest))
    result = runner.invoke(main, query)
    assert result.exit_code == 1
    assert "built with 0 bidirectional top layer(s)" in result.output and "re-index" in result.output


# ----------------------------------------------------------------- the fine-tuning benchmark on a decoder


def test_finetune_benchmark_trains_a_decoder_with_a_bidirectional_top_layer(
    decoder_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from condsearch.model.artifacts.adapters import read_adapter
    from tests.benchmarks.test_benchmarks import load_script

    argv = ["--smoke", "--model", str(decoder_dirs["qwen3"]), "--runs", "lora:mse,lora:mse+cmse", "--lora-rank", "2"]
    argv += ["--bidirectional-layers", "1", "--work-dir", str(tmp_path / "runs"), "--device", "cpu"]
    argv += ["--json-out", str(tmp_path / "out.json"), "--md-out", str(tmp_path / "out.md")]
    assert load_script("finetune").main(argv) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["config"]["encoder"] == {"bidirectional_layers": 1}
    assert [r["objectives"] for r in result["rows"]] == ["mse", "mse+cmse"]
    for row in result["rows"]:
        assert np.isfinite(row["dev_spearman"]) and row["encoder"] == {"bidirectional_layers": 1}
        assert read_adapter(Path(row["out"])).meta["encoder"]["bidirectional_layers"] == 1
    assert "bidirectional layers 1" in (tmp_path / "out.md").read_text()


# ----------------------------------------------------------------- CUDA (run with -m gpu; skipped where CUDA is absent)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("options", [{"bidirectional_layers": 1, "pooling": "mean"}, {"preset": "bellm"}])
def test_bidirectional_layers_on_cuda_equal_cpu(
    decoder_dirs: dict[str, Path], kind: str, dtype: str, options: dict[str, object]
) -> None:
    cpu = _encoder(decoder_dirs[kind], **options)
    gpu = load_encoder(EncoderSpec(str(decoder_dirs[kind]), dtype=dtype, **options, runtime=Runtime(device="cuda")))  # type: ignore[arg-type]
    assert isinstance(gpu, PromptEncoder) and next(gpu.model.parameters()).device.type == "cuda"
    batch, reference = gpu.encode_batch(PAIRS), cpu.encode_batch(PAIRS)
    cos = (batch * reference).sum(1) / np.linalg.norm(batch, axis=1) / np.linalg.norm(reference, axis=1)
    assert (cos > (0.9999 if dtype == "float32" else 0.99)).all(), cos
    # left padding stays right with the GPU's attention kernels too
    alone = np.stack([gpu.encode_batch([p])[0] for p in PAIRS])
    tol = 1e-4 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(batch, alone, rtol=0, atol=tol)
    causal = load_encoder(
        EncoderSpec(
            str(decoder_dirs[kind]),
            dtype=dtype,
            **{**options, "bidirectional_layers": 0},
            runtime=Runtime(device="cuda"),
        )
    )  # type: ignore[arg-type]
    assert not np.allclose(batch, causal.encode_batch(PAIRS), atol=tol)


@pytest.mark.gpu
@needs_cuda
def test_finetune_benchmark_on_cuda(decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    from tests.benchmarks.test_benchmarks import load_script

    argv = ["--smoke", "--model", str(decoder_dirs["llama"]), "--runs", "lora:mse+cmse", "--preset", "bellm"]
    argv += ["--device", "cuda", "--work-dir", str(tmp_path / "runs"), "--json-out", str(tmp_path / "out.json")]
    assert load_script("finetune").main(argv) == 0
    [row] = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert np.isfinite(row["dev_spearman"]) and row["encoder"] == {"preset": "bellm"}
