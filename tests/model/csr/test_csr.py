"""The router-CSR tri-encoder: differential tests of every shortcut it takes."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModel, AutoTokenizer

from condsearch.cli import main
from condsearch.corpus.csts import read_csts
from condsearch.errors import ModelError
from condsearch.model.csr import load_csr_encoder
from condsearch.model.csr.cache import StateCache, collate, split
from condsearch.model.csr.router import EXTENDED, PAPER, Router, RouterConfig
from condsearch.model.csr.weights import load_router_weights, save_router
from condsearch.train.router import (
    DEFAULT_LR,
    WHOLE_BACKBONE_LR,
    RouterTrainConfig,
    fit_router,
    pair_groups,
    wacl_loss,
)
from tests.conftest import SENTENCES, router_csts_csv
from tests.tolerance import assert_rows_close, routed_tolerance, text_tolerance

CONDITION = "color of the dress"


@pytest.fixture(scope="module")
def backbone(tiny_bert_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    model = AutoModel.from_pretrained(tiny_bert_dir).eval()
    return tokenizer, model


def _mean_pooled(model, inputs) -> torch.Tensor:
    hidden = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    return (hidden * mask).sum(1) / mask.sum(1)


def test_a_kept_state_cache_sees_shards_removed_and_added_since(tmp_path: Path, backbone) -> None:
    """A model kept between builds (a server's, issue 58) keeps its StateCache: a cache folder cleared
    meanwhile is a miss, not a read of a shard that is gone, and another process's new shard is found."""
    import shutil

    tokenizer, model = backbone
    router = Router(model).eval()
    with torch.inference_mode():
        states = split(router.sentence_states(tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")))
    kept = StateCache(tmp_path / "states", dtype=torch.float32)
    keys = ["aa" * 32, "bb" * 32]
    kept.put(keys[:1], states[:1])
    assert kept.missing(keys) == [1]
    StateCache(tmp_path / "states", dtype=torch.float32).put(keys[1:], states[1:])  # another process
    assert kept.missing(keys) == []
    shutil.rmtree(tmp_path / "states")  # the cache cleared while the model is kept
    assert kept.missing(keys) == [0, 1]
    kept.put(keys, states)
    assert kept.missing(keys) == [] and len(kept.get(keys)) == 2


@pytest.mark.numerics
@pytest.mark.parametrize("layer", [-1, 0, 1])
@pytest.mark.parametrize("variant", ["paper", "extended"])
def test_router_off_equals_plain_forward(backbone, layer: int, variant: str) -> None:
    """Routing off (w scaled by 0, or no condition) is the backbone's own mean-pooled forward pass."""
    tokenizer, model = backbone
    config = RouterConfig(layer=layer) if variant == "paper" else replace(EXTENDED, layer=layer)
    router = Router(model, config, w_scale=0.0).eval()
    inputs = tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = router.sentence_states(inputs)
        code = router.condition_codes(tokenizer([CONDITION], return_tensors="pt"))
        routed = router.route(states, code)  # an untrained condition projection is the identity
        plain = router.route(states, None)
        expected = _mean_pooled(model, inputs)
    tolerance = text_tolerance(model, tokenizer, SENTENCES[:4], CONDITION)
    assert_rows_close(routed.numpy(), expected.numpy(), tolerance)
    assert_rows_close(plain.numpy(), expected.numpy(), tolerance)


@pytest.mark.numerics
def test_paper_router_is_eq1(backbone) -> None:
    """The paper's variant adds no parameters and computes (1 + w) with layer t's own W_Q."""
    tokenizer, model = backbone
    router = Router(model, PAPER).eval()
    assert router.config.variant == "paper" and router.gains() == [1.0]
    assert router.router_queries is None and router.projection is None and router.log_gain is None
    own = {id(p) for p in model.parameters()}
    assert all(id(p) in own for p in router.trainable_parameters().values())
    layer = model.encoder.layer[-1]
    inputs = tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = router.sentence_states(inputs)
        cond = tokenizer([CONDITION], return_tensors="pt")
        code = router.condition_codes(cond)
        cls = model(**cond).last_hidden_state[:, 0]
        torch.testing.assert_close(code.q[:, 0], layer.attention.self.query(cls))
        # eq. 1 by hand: per-head softmax of q·k over real tokens, averaged over heads
        heads, dh = router.n_heads, router.head_dim
        q = code.q[:, 0].view(1, heads, 1, dh)
        k = states.k.view(2, -1, heads, dh).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)).squeeze(2) / dh**0.5
        w = scores.masked_fill(~states.mask[:, None], float("-inf")).softmax(-1).mean(1)
        context = states.c * (1 + w).unsqueeze(-1)
        out = layer.attention.output(context, states.x)
        hidden = layer.output(layer.intermediate(out), out)
        m = states.mask.unsqueeze(-1).float()
        expected = (hidden * m).sum(1) / m.sum(1)
        routed = router.route(states, code)
    assert_rows_close(routed.numpy(), expected.numpy(), text_tolerance(model, tokenizer, SENTENCES[:2], CONDITION))


def test_router_on_changes_vectors_and_depends_on_condition(backbone) -> None:
    tokenizer, model = backbone
    router = Router(copy.deepcopy(model), EXTENDED, w_scale=20.0).eval()
    with torch.no_grad():
        for q in router.router_queries or []:
            q.weight.mul_(30.0)  # a random tiny model attends almost uniformly; sharpen it
    inputs = tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = router.sentence_states(inputs)
        a = router.route(states, router.condition_codes(tokenizer(["the dress"], return_tensors="pt")))
        b = router.route(states, router.condition_codes(tokenizer(["tennis"], return_tensors="pt")))
        plain = _mean_pooled(model, inputs)
    assert not torch.allclose(a, plain)
    assert not torch.allclose(a, b)


@pytest.mark.numerics
def test_routing_weights_cover_only_real_tokens(backbone) -> None:
    """Padding must not change a sentence's routed vector (batch invariance)."""
    tokenizer, model = backbone
    router = Router(model, replace(EXTENDED, layer=0)).eval()
    q_inputs = tokenizer([CONDITION], return_tensors="pt")
    with torch.inference_mode():
        q = router.condition_codes(q_inputs)
        alone = router.route(router.sentence_states(tokenizer([SENTENCES[2]], return_tensors="pt")), q)
        batch = tokenizer([SENTENCES[0], SENTENCES[2], "short"], padding=True, return_tensors="pt")
        together = router.route(router.sentence_states(batch), q)
    tolerance = text_tolerance(model, tokenizer, [SENTENCES[2]], CONDITION)
    assert_rows_close(together[1:2].numpy(), alone.numpy(), tolerance)


def test_only_router_layers_train(backbone) -> None:
    _, model = backbone
    router = Router(copy.deepcopy(model), replace(EXTENDED, layer=1))
    router.freeze_backbone()
    trainable = {n for n, p in router.named_parameters() if p.requires_grad}
    assert trainable  # router query, gain, projection, rest of layer 1
    assert all(not n.startswith("model.embeddings") and "layer.0." not in n for n in trainable)
    assert not any("attention.self" in n for n in trainable)  # cached keys/context stay valid


def test_state_cache_round_trip(tmp_path: Path, backbone) -> None:
    tokenizer, model = backbone
    router = Router(model).eval()
    with torch.inference_mode():
        states = router.sentence_states(tokenizer(SENTENCES[:3], padding=True, return_tensors="pt"))
    cache = StateCache(tmp_path, dtype=torch.float32)
    keys = ["aa" * 32, "bb" * 32, "cc" * 32]
    cache.put(keys, split(states))
    reread = StateCache(tmp_path, dtype=torch.float32)  # a new process: index read from disk
    assert reread.missing(keys + ["dd" * 32]) == [3]
    got = collate(reread.get(list(reversed(keys))))
    lengths = states.mask.sum(1).tolist()
    for i, j in enumerate(reversed(range(3))):
        n = lengths[j]
        torch.testing.assert_close(got.x[i, :n], states.x[j, :n])
        torch.testing.assert_close(got.c[i, :n], states.c[j, :n])
        assert bool(got.mask[i, :n].all()) and not bool(got.mask[i, n:].any())


@pytest.mark.numerics
def test_cached_path_equals_uncached(tmp_path: Path, tiny_bert_dir: Path) -> None:
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path, state_dtype=torch.float32)
    cached = encoder.encode(SENTENCES, CONDITION, batch_size=3)
    tok = encoder.tokenizer
    with torch.inference_mode():
        inputs = tok(SENTENCES, padding=True, return_tensors="pt")
        q = encoder.router.condition_codes(tok([CONDITION], return_tensors="pt"))
        direct = encoder.router.route(encoder.router.sentence_states(inputs), q).numpy()
    assert_rows_close(cached, direct, routed_tolerance(encoder, SENTENCES, CONDITION))


def test_half_precision_cache_is_close(tmp_path: Path, tiny_bert_dir: Path) -> None:
    full = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "a", state_dtype=torch.float32)
    half = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "b")
    a = full.encode(SENTENCES, CONDITION)
    b = half.encode(SENTENCES, CONDITION)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.999


def test_quantized_states_round_trip_within_half_a_step() -> None:
    from condsearch.model.csr.cache import dequantize, quantize

    t = torch.randn(7, 16) * torch.logspace(-3, 2, 7)[:, None]  # rows of very different sizes
    values, scale = quantize(t)
    assert values.dtype == torch.int8 and scale.shape == (7,)
    assert bool(((dequantize(values, scale) - t).abs() <= scale[:, None] / 2 + 1e-7).all())
    zeros, zero_scale = quantize(torch.zeros(2, 4))  # an all-zero row stays zero, no division by zero
    assert not bool(dequantize(zeros, zero_scale).any())


def test_a_model_saved_in_float16_runs_in_float32(tmp_path: Path, tiny_bert_dir: Path) -> None:
    half_dir = tmp_path / "half"
    AutoModel.from_pretrained(str(tiny_bert_dir)).half().save_pretrained(half_dir)
    AutoTokenizer.from_pretrained(str(tiny_bert_dir)).save_pretrained(half_dir)
    encoder = load_csr_encoder(str(half_dir), router="none", cache_dir=tmp_path / "c")
    assert next(encoder.router.parameters()).dtype == torch.float32  # as CASE loads it: no Half/Float mix
    full = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "d")
    a, b = encoder.encode(SENTENCES, CONDITION), full.encode(SENTENCES, CONDITION)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.999  # only the weights' rounding differs


def test_cache_is_reused_across_runs(tmp_path: Path, tiny_bert_dir: Path, monkeypatch) -> None:
    first = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path)
    a = first.encode(SENTENCES, CONDITION)
    second = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path)
    calls: list[int] = []
    original = second.router.sentence_states
    monkeypatch.setattr(
        second.router,
        "sentence_states",
        lambda inputs: calls.append(1) or original(inputs),  # type: ignore[func-returns-value]
    )
    b = second.encode(SENTENCES + [SENTENCES[0]], "a new condition")
    assert calls == []  # nothing recomputed: every sentence came from the disk cache
    c = second.encode(SENTENCES, CONDITION)
    np.testing.assert_allclose(a, c, atol=1e-6)
    assert b.shape == (len(SENTENCES) + 1, a.shape[1])
    np.testing.assert_array_equal(b[0], b[-1])


def test_router_weights_round_trip(tmp_path: Path, tiny_bert_dir: Path) -> None:
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "cache")
    with torch.no_grad():
        for p in encoder.router.trainable_parameters().values():
            p.add_(0.01 * torch.randn_like(p))
    expected = encoder.encode(SENTENCES, CONDITION)
    save_router(encoder.router, tmp_path / "router", {"model_id": encoder.model_id}, dtype=torch.float32)
    again = load_csr_encoder(str(tiny_bert_dir), router=str(tmp_path / "router"), cache_dir=tmp_path / "cache")
    np.testing.assert_allclose(again.encode(SENTENCES, CONDITION), expected, atol=1e-5)
    assert again.describe()["router_checksum"]
    other = Router(AutoModel.from_pretrained(tiny_bert_dir), RouterConfig(layer=0))
    with pytest.raises(ModelError, match="layer"):
        load_router_weights(other, tmp_path / "router")


def test_pair_groups_put_the_high_row_first(tmp_path: Path) -> None:
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    groups = pair_groups(data)
    assert len(groups) == 6 and all(len(g) == 2 for g in groups)
    assert all(data.labels[g[0]] >= data.labels[g[1]] for g in groups)


def test_wacl_loss_matches_equation() -> None:
    cos_pos, cos_neg = torch.tensor([0.9, 0.2]), torch.tensor([0.1, 0.6])
    y_pos, y_neg = torch.tensor([1.0, 0.75]), torch.tensor([0.0, 0.5])
    expected = (1.0 * abs(1.0 + 0.1 - 0.9) + 0.25 * abs(0.25 + 0.6 - 0.2)) / 2
    assert wacl_loss(cos_pos, cos_neg, y_pos, y_neg).item() == pytest.approx(expected)


def test_eq1_with_the_whole_backbone_trains_every_layer_and_reloads(tmp_path: Path, tiny_bert_dir: Path) -> None:
    """The paper's own setting: eq. 1 with the whole backbone trained; its states are keyed by its weights."""
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "cache")
    untrained_cache = encoder.states.directory
    before = {n: p.detach().clone() for n, p in encoder.router.model.named_parameters()}
    config = RouterTrainConfig(epochs=1, lr=1e-3, batch_size=4, warmup=0.0, train_backbone="all")
    fit_router(encoder, data, config)
    moved = {n for n, p in encoder.router.model.named_parameters() if not torch.equal(p, before[n])}
    assert "embeddings.word_embeddings.weight" in moved and any("layer.0.attention.self" in n for n in moved)
    assert encoder.states.directory != untrained_cache  # states cached with the base weights are never read
    save_router(encoder.router, tmp_path / "r", {})
    again = load_csr_encoder(str(tiny_bert_dir), router=str(tmp_path / "r"), cache_dir=tmp_path / "cache")
    assert again.router.trainable == "all"
    got = again.encode(SENTENCES[:3], "color")
    expected = encoder.encode(SENTENCES[:3], "color")
    np.testing.assert_allclose(got, expected, atol=5e-3)  # saved as float16
    assert again.states.directory != untrained_cache


@pytest.mark.parametrize("loss", ["mse", "mse+wacl"])
def test_training_keeps_the_best_dev_epoch(tmp_path: Path, tiny_bert_dir: Path, loss: str) -> None:
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "cache")
    frozen = {n: p.detach().clone() for n, p in encoder.router.named_parameters() if "attention.self" in n}
    history = fit_router(encoder, data, RouterTrainConfig(epochs=2, lr=1e-3, loss=loss), dev=data)
    assert [r["epoch"] for r in history] == [0, 1, 2]
    assert all(np.isfinite(r["loss"]) for r in history[1:])
    for n, p in encoder.router.named_parameters():
        if n in frozen:
            torch.testing.assert_close(p, frozen[n])  # cached states stay valid


def test_cli_csr_train_index_query(tmp_path: Path, tiny_bert_dir: Path, corpus_file: Path) -> None:
    runner = CliRunner()
    train_csv = router_csts_csv(tmp_path / "train.csv")
    out = tmp_path / "router"
    res = runner.invoke(
        main,
        [
            "train",
            "router",
            str(train_csv),
            "--dev",
            str(train_csv),
            "--model",
            str(tiny_bert_dir),
            "--out",
            str(out),
            "--epochs",
            "1",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert (out / "router.safetensors").is_file() and summary["layer"] == 1
    index_dir = tmp_path / "idx"
    common = ["--index-dir", str(index_dir)]
    res = runner.invoke(
        main,
        [
            "index",
            str(corpus_file),
            "--mode",
            "csr",
            "--model",
            str(tiny_bert_dir),
            "--router",
            str(out),
            "-c",
            "the colour",
            "-c",
            "the sport",
            *common,
        ],
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads(next(index_dir.glob("the-colour-*/manifest.json")).read_text())
    assert manifest["mode"] == "csr" and manifest["encoder"]["router_checksum"] == summary["checksum"]
    res = runner.invoke(main, ["query", SENTENCES[0], "-c", "the colour", "-k", "3", "--json", *common])
    assert res.exit_code == 0, res.output
    results = json.loads(res.stdout)["results"]
    assert results[0]["id"] == "s0" and results[0]["score"] == pytest.approx(1.0, abs=1e-4)
    # the router changed after indexing: queries are refused rather than mixing vector spaces
    (out / "router.safetensors").write_bytes((out / "router.safetensors").read_bytes()[:-8] + b"\0" * 8)
    res = runner.invoke(main, ["query", SENTENCES[0], "-c", "the colour", *common])
    assert res.exit_code == 1 and "router" in res.stderr and "Traceback" not in res.output


def test_cli_csr_refuses_a_head(tmp_path: Path, tiny_bert_dir: Path, corpus_file: Path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "index",
            str(corpus_file),
            "--mode",
            "csr",
            "--model",
            str(tiny_bert_dir),
            "--head",
            "default",
            "-c",
            CONDITION,
            "--index-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2 and "apply to --mode case only" in res.stderr


@pytest.mark.parametrize(
    "flag",
    [
        ["--pooling", "mean"],
        ["--prompt-template", "{condition}: {text}"],
        ["--unconditional-template", "{text}"],
        ["--dtype", "float32"],
    ],
)
def test_cli_csr_refuses_case_only_encoder_flags(
    flag: list[str], tmp_path: Path, tiny_bert_dir: Path, corpus_file: Path
) -> None:
    args = ["index", str(corpus_file), "--mode", "csr", "--model", str(tiny_bert_dir), "-c", CONDITION, *flag]
    res = CliRunner().invoke(main, [*args, "--index-dir", str(tmp_path / "idx")])
    assert res.exit_code == 2 and "apply to --mode case" in res.stderr and not (tmp_path / "idx").exists()


def test_training_makes_the_extended_router_condition(tmp_path: Path, tiny_bert_dir: Path) -> None:
    """Pairs whose labels differ by condition pull the two routed vectors apart as training goes.

    (A random tiny BERT gives every condition nearly the same [CLS] state, so the paper's
    router, whose query is layer t's frozen W_Q of that state, cannot show it here.)
    """
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", variant="extended", cache_dir=tmp_path / "c")
    config = RouterTrainConfig(epochs=4, lr=1e-2, batch_size=4, warmup=0.0)
    history = fit_router(encoder, data, config, dev=data)
    start, trained = history[0], history[1:]
    assert start["dev_condition_sensitivity"] < 1e-3  # an untrained router barely conditions
    assert max(r["dev_condition_sensitivity"] for r in trained) > 10 * start["dev_condition_sensitivity"]


def test_extended_router_round_trip_and_old_format(tmp_path: Path, tiny_bert_dir: Path) -> None:
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", variant="extended", cache_dir=tmp_path / "c")
    with torch.no_grad():
        for p in encoder.router.trainable_parameters().values():
            p.add_(0.05 * torch.randn_like(p))
    expected = encoder.encode(SENTENCES, CONDITION)
    save_router(encoder.router, tmp_path / "r", {"model_id": encoder.model_id}, dtype=torch.float32)
    again = load_csr_encoder(str(tiny_bert_dir), router=str(tmp_path / "r"), cache_dir=tmp_path / "c")
    assert again.router.config == encoder.router.config and again.describe()["router_variant"] == "extended"
    np.testing.assert_allclose(again.encode(SENTENCES, CONDITION), expected, atol=1e-5)
    with pytest.raises(ModelError, match="extended variant, not paper"):
        load_csr_encoder(str(tiny_bert_dir), router=str(tmp_path / "r"), variant="paper", cache_dir=tmp_path / "c")
    meta = json.loads((tmp_path / "r" / "router.json").read_text())
    (tmp_path / "r" / "router.json").write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.raises(ModelError, match="retrain"):
        load_csr_encoder(str(tiny_bert_dir), router=str(tmp_path / "r"), cache_dir=tmp_path / "c")


def test_cli_router_defaults_come_from_the_config() -> None:
    """`train router` defaults to what RouterTrainConfig holds; lr None is the variant's own."""
    defaults = RouterTrainConfig()
    command = main.commands["train"].get_command(click.Context(main), "router")  # type: ignore[attr-defined]
    options = {p.opts[-1]: p.default for p in command.params if isinstance(p, click.Option)}
    assert (options["--lr"], options["--epochs"], options["--train-batch-size"], options["--loss"]) == (
        defaults.lr,
        defaults.epochs,
        defaults.batch_size,
        defaults.loss,
    )
    assert (options["--k"], options["--init"], options["--train-backbone"]) == (2, "base", None)
    for variant, lr in DEFAULT_LR.items():
        assert defaults.resolved(variant).lr == lr
    assert defaults.resolved("context").train_backbone == "all"
    assert defaults.resolved("paper").train_backbone == "top"
    assert replace(defaults, train_backbone="all").resolved("paper").lr == WHOLE_BACKBONE_LR
    res = CliRunner().invoke(main, ["train", "router", "--help"], terminal_width=400)
    assert f"[default: {defaults.epochs};" in " ".join(res.output.split())
