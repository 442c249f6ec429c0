"""The context router (ours): differential tests of its cache, its artifact and its training."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file

from condsearch.cli import main
from condsearch.corpus.csts import read_csts, scale_labels
from condsearch.errors import ModelError
from condsearch.model.csr import load_csr_encoder
from condsearch.model.csr.compact_delta import decode
from condsearch.model.csr.context import ContextConfig, ContextRouter
from condsearch.model.csr.context_weights import backbone_delta, fitting_rank, save_context_router
from condsearch.model.csr.encoder import CsrEncoder
from condsearch.store.vectors import vector_fingerprint
from condsearch.train.checkpoint import TrainingState
from condsearch.train.router import RouterTrainConfig, fit_router
from tests.conftest import SENTENCES, router_csts_csv
from tests.tolerance import assert_rows_close, routed_tolerance, text_tolerance

CONDITION = "color of the dress"
N_LAYERS = 3


@pytest.fixture(scope="module")
def deep_bert_dir(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT's tokenizer over a random 3-layer BERT, so that k = 1, 2, 3 all differ."""
    folder = tmp_path_factory.mktemp("deep-bert")
    for f in tiny_bert_dir.iterdir():
        if "token" in f.name or f.name in ("vocab.txt", "special_tokens_map.json"):
            shutil.copy(f, folder / f.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert_dir)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    torch.manual_seed(3)
    transformers.BertModel(config).eval().save_pretrained(str(folder))
    return folder


def _encoder(folder: Path, tmp: Path, *, k: int = 2, router: str = "none") -> CsrEncoder:
    variant = "context" if router == "none" else None
    layer = -k if router == "none" else None
    return load_csr_encoder(
        str(folder), router=router, variant=variant, layer=layer, cache_dir=tmp, state_dtype=torch.float32
    )


def _joint_reference(model: torch.nn.Module, tokenizer, sentences: list[str], condition: str, k: int) -> torch.Tensor:
    """The uncached forward pass written another way: one joint [condition; sentence] sequence.

    Each part keeps its own positions; below layer T-k every token attends within its own part,
    from T-k up sentence tokens attend to both parts (the condition still to itself only). The
    sentence part of the last layer is mean-pooled.
    """
    s = tokenizer(sentences, padding=True, return_tensors="pt")
    c = tokenizer([condition], return_tensors="pt")
    b, ls = s["input_ids"].shape
    lc = c["input_ids"].shape[1]
    ids = torch.cat([c["input_ids"].expand(b, -1), s["input_ids"]], dim=1)
    positions = torch.cat([torch.arange(lc), torch.arange(ls)]).expand(b, -1)
    valid = torch.cat([c["attention_mask"].expand(b, -1), s["attention_mask"]], dim=1).bool()
    is_condition = torch.arange(lc + ls) < lc
    same_part = is_condition[:, None] == is_condition[None, :]
    lower = same_part[None] & valid[:, None, :]
    upper = (same_part | ~is_condition[:, None])[None] & valid[:, None, :]

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]

    layers = model.encoder.layer
    with torch.inference_mode():
        hidden = model.embeddings(input_ids=ids, position_ids=positions)
        for j, layer in enumerate(layers):
            out = layer(hidden, attention_mask=additive(lower if j < len(layers) - k else upper))
            hidden = out[0] if isinstance(out, tuple) else out
        part = hidden[:, lc:]
        mask = s["attention_mask"].unsqueeze(-1).float()
        return (part * mask).sum(1) / mask.sum(1)


@pytest.mark.numerics
@pytest.mark.parametrize("k", [1, 2, 3])
def test_cached_path_equals_the_uncached_forward_pass(tmp_path: Path, deep_bert_dir: Path, k: int, monkeypatch) -> None:
    """Cached lower-layer sentence states + a cached condition code = the joint forward pass, up to rounding."""
    encoder = _encoder(deep_bert_dir, tmp_path, k=k)
    assert encoder.router.layer == N_LAYERS - k and encoder.describe()["router_variant"] == "context"
    expected = _joint_reference(encoder.router.model, encoder.tokenizer, SENTENCES, CONDITION, k).numpy()
    tolerance = routed_tolerance(encoder, SENTENCES, CONDITION)
    assert_rows_close(encoder.encode(SENTENCES, CONDITION, batch_size=3), expected, tolerance)
    again = _encoder(deep_bert_dir, tmp_path, k=k)  # a new process: both caches read from disk
    monkeypatch.setattr(again.router, "sentence_states", lambda inputs: pytest.fail("recomputed a cached sentence"))
    monkeypatch.setattr(again.router, "condition_codes", lambda inputs: pytest.fail("recomputed a cached condition"))
    assert_rows_close(again.encode(SENTENCES, CONDITION, batch_size=4), expected, tolerance)


@pytest.mark.numerics
def test_rows_under_their_own_conditions(tmp_path: Path, deep_bert_dir: Path) -> None:
    """Sentences of one batch under conditions of different lengths (padded condition keys)."""
    encoder = _encoder(deep_bert_dir, tmp_path, k=2)
    conditions = ["the sport", CONDITION, "mood", "the colour of the shirt and the hat"] * 3
    texts = SENTENCES[: len(conditions)]
    got = encoder.encode(texts, conditions[: len(texts)], batch_size=5)
    tolerance = routed_tolerance(encoder, texts, conditions)
    for i, (text, cond) in enumerate(zip(texts, conditions, strict=False)):
        want = _joint_reference(encoder.router.model, encoder.tokenizer, [text], cond, 2).numpy()
        assert_rows_close(got[i : i + 1], want, tolerance[i])


@pytest.mark.numerics
def test_no_condition_is_the_plain_forward_pass(tmp_path: Path, deep_bert_dir: Path) -> None:
    encoder = _encoder(deep_bert_dir, tmp_path, k=2)
    inputs = encoder.tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    with torch.inference_mode():
        routed = encoder.router.route(encoder.router.sentence_states(inputs), None)
        hidden = encoder.router.model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    tolerance = text_tolerance(encoder.router.model, encoder.tokenizer, SENTENCES[:4])
    assert_rows_close(routed.numpy(), ((hidden * mask).sum(1) / mask.sum(1)).numpy(), tolerance)


def test_layers_below_t_minus_k_never_see_the_condition(tmp_path: Path, deep_bert_dir: Path) -> None:
    """Sentence states below layer T-k are bitwise the same under any condition; above, they differ."""
    encoder = _encoder(deep_bert_dir, tmp_path, k=1)
    router = encoder.router
    inputs = encoder.tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")
    shape = tuple(inputs["input_ids"].shape)
    seen: dict[int, list[torch.Tensor]] = {}
    hooks = [
        layer.register_forward_hook(
            lambda module, args, out, j=j: (
                seen.setdefault(j, []).append(out[0] if isinstance(out, tuple) else out)
                if tuple(args[0].shape[:2]) == shape
                else None
            )
        )
        for j, layer in enumerate(router.model.encoder.layer)
    ]
    try:
        with torch.inference_mode():
            for condition in ("the dress", "which sport is played on the clay court"):
                codes = router.condition_codes(encoder.tokenizer([condition], return_tensors="pt"))
                router.route(router.sentence_states(inputs), codes)
    finally:
        for hook in hooks:
            hook.remove()
    for j in range(N_LAYERS):
        first, second = seen[j]
        if j < router.layer:
            assert torch.equal(first, second), j
        else:
            assert not torch.allclose(first, second), j


def test_changing_the_condition_changes_the_vector(tmp_path: Path, deep_bert_dir: Path) -> None:
    encoder = _encoder(deep_bert_dir, tmp_path, k=1)
    a = encoder.encode(SENTENCES[:4], "the dress")
    b = encoder.encode(SENTENCES[:4], "tennis")
    assert not np.allclose(a, b, atol=1e-4)


def _perturb(encoder: CsrEncoder, scale: float = 0.02, seed: int = 0, rank: int | None = None) -> None:
    """Add noise to every trainable weight (to each matrix as a rank-``rank`` product when given)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.router.trainable_parameters().values():
            if rank is not None and p.ndim == 2:
                u = torch.randn(p.shape[0], rank, generator=generator)
                v = torch.randn(rank, p.shape[1], generator=generator)
                p.add_(scale * u @ v / rank)
            else:
                p.add_(scale * torch.randn(p.shape, generator=generator))
    encoder.refresh_identity()


def _base(folder: Path) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in transformers.AutoModel.from_pretrained(str(folder)).named_parameters()}


def _save(encoder: CsrEncoder, folder: Path, out: Path, **kwargs) -> str:
    assert isinstance(encoder.router, ContextRouter)
    delta, rank = backbone_delta(_base(folder), encoder.router.model, **kwargs)
    return save_context_router(encoder.router, delta, rank, out, {"model_id": encoder.model_id})


@pytest.mark.parametrize(
    ("options", "atol"),
    [({"dtype": torch.float32}, 1e-5), ({}, 2e-3)],
    ids=["whole", "float16"],
)
def test_save_load_gives_the_same_vectors(tmp_path: Path, deep_bert_dir: Path, options: dict, atol: float) -> None:
    encoder = _encoder(deep_bert_dir, tmp_path / "cache", k=2)
    _perturb(encoder, rank=2)  # a rank-2 change of each matrix: its rank-4 factors hold it exactly
    expected = encoder.encode(SENTENCES, CONDITION)
    checksum = _save(encoder, deep_bert_dir, tmp_path / "router", **options)
    meta = json.loads((tmp_path / "router" / "router.json").read_text())
    assert meta["router_config"] == {"k": 2, "variant": "context"} and meta["layer"] == N_LAYERS - 2
    assert meta["backbone_delta"]["rank"] is None and meta["backbone_delta"]["encoding"] == "whole"
    with safe_open(str(tmp_path / "router" / "router.safetensors"), "pt") as fh:
        assert all(key.endswith(".delta") for key in fh.keys())
    again = _encoder(deep_bert_dir, tmp_path / "cache", router=str(tmp_path / "router"))
    assert again.describe()["router_checksum"] == checksum and again.router.config == ContextConfig(k=2)
    np.testing.assert_allclose(again.encode(SENTENCES, CONDITION), expected, atol=atol)
    with pytest.raises(ModelError, match="context variant, not paper"):
        load_csr_encoder(str(deep_bert_dir), router=str(tmp_path / "router"), variant="paper", cache_dir=tmp_path)
    with pytest.raises(ModelError, match="routes from layer"):
        load_csr_encoder(str(deep_bert_dir), router=str(tmp_path / "router"), layer=-1, cache_dir=tmp_path)


def test_a_compact_change_loads_exactly_as_saved(tmp_path: Path, deep_bert_dir: Path) -> None:
    encoder = _encoder(deep_bert_dir, tmp_path / "cache", k=2)
    _perturb(encoder, rank=2)  # a rank-2 change of each matrix: its rank-4 factors hold it up to int8 rounding
    base = _base(deep_bert_dir)
    trained = {n: p.detach().clone() for n, p in encoder.router.model.named_parameters()}
    checksum = _save(encoder, deep_bert_dir, tmp_path / "router", max_bytes=0, rank=4)
    meta = json.loads((tmp_path / "router" / "router.json").read_text())["backbone_delta"]
    assert meta["rank"] == 4 and meta["encoding"] == "compact"
    saved = load_file(str(tmp_path / "router" / "router.safetensors"))
    table = "embeddings.word_embeddings.weight"
    assert saved[f"{table}.sdelta_signs"].dtype == torch.uint8 and f"{table}.qdelta_b" not in saved
    assert saved["encoder.layer.0.intermediate.dense.weight.qdelta_b"].dtype == torch.int8
    shapes = {n: tuple(t.shape) for n, t in base.items()}
    decoded = decode(saved, shapes)
    again = _encoder(deep_bert_dir, tmp_path / "cache", router=str(tmp_path / "router"))
    assert again.describe()["router_checksum"] == checksum
    loaded = dict(again.router.model.named_parameters())
    for name, p in base.items():
        if name.startswith("pooler."):
            continue
        if f"{name}.delta" in decoded:
            change = decoded[f"{name}.delta"]
        else:
            change = decoded[f"{name}.delta_b"] @ decoded[f"{name}.delta_a"]
        torch.testing.assert_close(loaded[name].detach(), p + change, atol=1e-6, rtol=0)  # what was saved, exactly
        if name != table and p.ndim == 2:  # the factors hold the rank-2 change up to int8 rounding
            true = trained[name] - p
            assert torch.linalg.norm(change - true) <= 0.02 * torch.linalg.norm(true)
    true = trained[table] - base[table]
    expected = true.sign() * true.abs().mean(dim=1, keepdim=True)  # each row: its signs times its mean magnitude
    torch.testing.assert_close(decoded[f"{table}.delta"], expected, atol=1e-3, rtol=1e-3)


def test_wise_scales_a_saved_routers_change(tmp_path: Path, deep_bert_dir: Path) -> None:
    """benchmarks/studies/wise.py --router: the base model plus alpha times the saved change, compact or whole."""
    from tests.benchmarks.test_benchmarks import load_script

    encoder = _encoder(deep_bert_dir, tmp_path / "cache", k=2)
    _perturb(encoder, rank=2)
    _save(encoder, deep_bert_dir, tmp_path / "router", max_bytes=0, rank=4)  # compact: int8 factors, sign rows
    wise = load_script("wise")
    loaded = {}
    for alpha in (1.0, 0.5):
        out = wise.scale_router(tmp_path / "router", alpha, tmp_path / f"a{alpha}", str(deep_bert_dir))
        assert json.loads((out / "router.json").read_text())["wise_alpha"] == alpha
        again = _encoder(deep_bert_dir, tmp_path / "cache", router=str(out))
        loaded[alpha] = {n: p.detach() for n, p in again.router.model.named_parameters()}
        if alpha == 1.0:  # the decoded change, stored whole: the same vectors as the source router
            source = _encoder(deep_bert_dir, tmp_path / "cache", router=str(tmp_path / "router"))
            np.testing.assert_allclose(
                again.encode(SENTENCES, CONDITION), source.encode(SENTENCES, CONDITION), atol=1e-5
            )
    for name, p in _base(deep_bert_dir).items():
        if not name.startswith("pooler."):
            torch.testing.assert_close(loaded[0.5][name], p + 0.5 * (loaded[1.0][name] - p), atol=1e-6, rtol=0)
    assert any(not torch.equal(loaded[0.5][n], loaded[1.0][n]) for n in loaded[1.0])
    paper = tmp_path / "paper"
    paper.mkdir()
    (paper / "router.json").write_text(
        json.dumps({"format_version": 2, "layer": 2, "router_config": {"variant": "paper"}})
    )
    with pytest.raises(SystemExit, match="not a context router"):
        wise.scale_router(paper, 0.5, tmp_path / "out", str(deep_bert_dir))


def test_a_compact_change_fits_its_budget_on_disk(tmp_path: Path, deep_bert_dir: Path) -> None:
    encoder = _encoder(deep_bert_dir, tmp_path / "cache", k=2)
    _perturb(encoder)  # every value changes: the whole change is as large as the model
    whole = sum(p.numel() * 2 for n, p in encoder.router.model.named_parameters() if not n.startswith("pooler."))
    budget = int(whole * 0.6)
    _save(encoder, deep_bert_dir, tmp_path / "router", max_bytes=budget)
    rank = json.loads((tmp_path / "router" / "router.json").read_text())["backbone_delta"]["rank"]
    assert rank is not None and rank >= 1
    assert (tmp_path / "router" / "router.safetensors").stat().st_size <= budget  # the header counted too


def test_the_rank_is_the_largest_that_fits() -> None:
    shapes = [(384, 384), (1536, 384), (384,), (2, 384)]

    def size(r: int) -> int:  # int8 factors and their scales only where they are smaller than the matrix
        return sum(min(2 * s[0] * s[1], (s[0] + s[1] + 4) * min(r, *s)) if len(s) == 2 else 2 * s[0] for s in shapes)

    for budget in (5_000, 200_000, 1_000_000, 2_000_000):
        r = fitting_rank(shapes, budget)
        assert r == 1 or size(r) <= budget
        assert r == 384 or size(r + 1) > budget


@pytest.mark.numerics
def test_a_cache_filled_with_other_weights_is_never_read(tmp_path: Path, deep_bert_dir: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    first = _encoder(deep_bert_dir, cache, k=2)
    _perturb(first, seed=1)
    _save(first, deep_bert_dir, tmp_path / "a", dtype=torch.float32)
    second = _encoder(deep_bert_dir, cache, k=2)
    _perturb(second, seed=2)
    _save(second, deep_bert_dir, tmp_path / "b", dtype=torch.float32)
    a = _encoder(deep_bert_dir, cache, router=str(tmp_path / "a"))
    a.encode(SENTENCES, CONDITION)  # fills the sentence and condition caches with a's weights
    b = _encoder(deep_bert_dir, cache, router=str(tmp_path / "b"))
    assert a.describe()["router_checksum"] != b.describe()["router_checksum"]
    assert b.states.directory != a.states.directory and b._query_ident != a._query_ident
    calls: list[int] = []
    original = b.router.sentence_states
    monkeypatch.setattr(b.router, "sentence_states", lambda inputs: calls.append(1) or original(inputs))
    got = b.encode(SENTENCES, CONDITION)
    assert calls  # computed with b's weights, not read from a's cache
    want = _joint_reference(b.router.model, b.tokenizer, SENTENCES, CONDITION, 2).numpy()
    assert_rows_close(got, want, routed_tolerance(b, SENTENCES, CONDITION))
    fingerprints = {
        vector_fingerprint(e.describe(), mode="csr", head_checksum="", dim=e.dim)
        for e in (a, b, _encoder(deep_bert_dir, cache))
    }
    assert len(fingerprints) == 3  # what the incremental re-index compares
    # weights changed in memory (training) rename the caches too
    untrained = _encoder(deep_bert_dir, cache, k=2)
    before = untrained.states.directory
    _perturb(untrained, seed=3)
    assert untrained.states.directory != before


def test_int8_states_by_default_route_close_to_float32(tmp_path: Path, deep_bert_dir: Path) -> None:
    exact = _encoder(deep_bert_dir, tmp_path / "cache", k=2)
    small = load_csr_encoder(
        str(deep_bert_dir), router="none", variant="context", layer=-2, cache_dir=tmp_path / "cache"
    )
    assert small.states.dtype == torch.int8 and small.states.directory != exact.states.directory
    a = exact.encode(SENTENCES, CONDITION)
    b = small.encode(SENTENCES, CONDITION)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 1 - 1e-2  # the bound the int8 default was chosen under
    with safe_open(str(next(small.states.directory.glob("shard-*"))), framework="pt") as fh:
        assert fh.get_slice("x").get_dtype() == "I8" and fh.get_slice("x.scale").get_dtype() == "F32"
    assert 0 < small.states.nbytes_per_sentence() < exact.states.nbytes_per_sentence() / 3


def _mse(encoder: CsrEncoder, data) -> float:
    a = encoder.encode(data.sentence1, data.condition)
    b = encoder.encode(data.sentence2, data.condition)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(np.mean((cos - scale_labels(data.labels)) ** 2))


@pytest.mark.parametrize("scope", ["all", "top"])
def test_one_epoch_lowers_the_loss(tmp_path: Path, deep_bert_dir: Path, scope: str) -> None:
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    encoder = _encoder(deep_bert_dir, tmp_path / "cache", k=1)
    below = {n: p.detach().clone() for n, p in encoder.router.model.named_parameters()}
    before = _mse(encoder, data)
    config = RouterTrainConfig(epochs=1, lr=3e-3, batch_size=4, warmup=0.0, train_backbone=scope)
    history = fit_router(encoder, data, config)
    assert [r["epoch"] for r in history] == [1]
    assert _mse(encoder, data) < before
    top = f"encoder.layer.{N_LAYERS - 1}."
    for name, p in encoder.router.model.named_parameters():
        if scope == "top" and not name.startswith(top):
            assert torch.equal(p, below[name]), name  # the cached states' layers stay as they were


def test_resume_continues_where_training_stopped(tmp_path: Path, deep_bert_dir: Path) -> None:
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    config = RouterTrainConfig(epochs=2, lr=1e-3, batch_size=4, train_backbone="top")

    straight = _encoder(deep_bert_dir, tmp_path / "c1", k=1)
    expected = fit_router(straight, data, config, dev=data, checkpoint_dir=tmp_path / "ck1")

    class Stop(Exception):
        pass

    def stop(epoch: int, loss: float, scores: object) -> None:
        raise Stop

    cut = _encoder(deep_bert_dir, tmp_path / "c2", k=1)
    with pytest.raises(Stop):
        fit_router(cut, data, config, dev=data, checkpoint_dir=tmp_path / "ck2", on_epoch=stop)
    resumed = _encoder(deep_bert_dir, tmp_path / "c3", k=1)
    history = fit_router(resumed, data, config, dev=data, checkpoint_dir=tmp_path / "ck2", resume=True)
    assert [r["epoch"] for r in history] == [0, 1, 2]
    assert history[-1]["loss"] == pytest.approx(expected[-1]["loss"], rel=1e-5)
    for (name, p), q in zip(
        resumed.router.trainable_parameters().items(), straight.router.trainable_parameters().values(), strict=True
    ):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    with pytest.raises(ModelError, match="other settings"):
        other = replace(config, lr=2e-3)
        fit_router(
            _encoder(deep_bert_dir, tmp_path / "c4", k=1), data, other, checkpoint_dir=tmp_path / "ck2", resume=True
        )


@pytest.mark.parametrize("scope", ["all", "top"])
def test_resume_continues_from_a_checkpoint_within_an_epoch(
    tmp_path: Path, deep_bert_dir: Path, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.train.router as training

    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    config = RouterTrainConfig(epochs=2, lr=1e-3, batch_size=4, train_backbone=scope)
    straight = _encoder(deep_bert_dir, tmp_path / "c1", k=1)
    expected = fit_router(straight, data, config, dev=data, checkpoint_dir=tmp_path / "ck1", checkpoint_every=1)

    class Stop(Exception):
        pass

    saved = training.save_checkpoint

    def save_then_stop(folder: Path, state: TrainingState, *args: object) -> None:
        saved(folder, state, *args)
        if state.epoch == 1 and state.epoch_step == 1:  # a checkpoint within epoch 2, after its first step
            raise Stop

    monkeypatch.setattr(training, "save_checkpoint", save_then_stop)
    with pytest.raises(Stop):
        fit_router(
            _encoder(deep_bert_dir, tmp_path / "c2", k=1),
            data,
            config,
            dev=data,
            checkpoint_dir=tmp_path / "ck2",
            checkpoint_every=1,
        )
    monkeypatch.setattr(training, "save_checkpoint", saved)
    resumed = _encoder(deep_bert_dir, tmp_path / "c3", k=1)
    history = fit_router(
        resumed, data, config, dev=data, checkpoint_dir=tmp_path / "ck2", resume=True, checkpoint_every=1
    )
    assert [r["epoch"] for r in history] == [0, 1, 2]
    assert history[-1]["loss"] == pytest.approx(expected[-1]["loss"], rel=1e-5)
    for (name, p), q in zip(
        resumed.router.trainable_parameters().items(), straight.router.trainable_parameters().values(), strict=True
    ):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)


def test_other_variants_refuse_context_settings(tmp_path: Path, deep_bert_dir: Path) -> None:
    data = read_csts(router_csts_csv(tmp_path / "t.csv"))
    encoder = load_csr_encoder(str(deep_bert_dir), router="none", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="context router"):
        fit_router(encoder, data, RouterTrainConfig(init="full"))


def test_cli_trains_indexes_and_queries(tmp_path: Path, deep_bert_dir: Path, corpus_file: Path) -> None:
    runner = CliRunner()
    train_csv = router_csts_csv(tmp_path / "train.csv")
    out = tmp_path / "router"
    base = ["train", "router", str(train_csv), "--model", str(deep_bert_dir), "--out", str(out)]
    res = runner.invoke(
        main,
        [
            *base,
            "--dev",
            str(train_csv),
            "--variant",
            "context",
            "--k",
            "2",
            "--train-backbone",
            "top",
            "--epochs",
            "1",
            "--checkpoint-dir",
            str(tmp_path / "ck"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["variant"] == "context" and summary["layer"] == N_LAYERS - 2
    assert summary["config"]["lr"] == 1e-4 and (tmp_path / "ck" / "checkpoint.json").is_file()
    assert (out / "router.safetensors").is_file()
    index_dir = tmp_path / "idx"
    res = runner.invoke(
        main,
        [
            "index",
            str(corpus_file),
            "--mode",
            "csr",
            "--model",
            str(deep_bert_dir),
            "--router",
            str(out),
            "-c",
            "the colour",
            "--index-dir",
            str(index_dir),
        ],
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads(next(index_dir.glob("the-colour-*/manifest.json")).read_text())
    assert manifest["encoder"]["router_checksum"] == summary["checksum"]
    assert manifest["encoder"]["router_variant"] == "context"
    res = runner.invoke(
        main, ["query", SENTENCES[0], "-c", "the colour", "-k", "3", "--json", "--index-dir", str(index_dir)]
    )
    assert res.exit_code == 0, res.output
    results = json.loads(res.stdout)["results"]
    assert results[0]["id"] == "s0" and results[0]["score"] == pytest.approx(1.0, abs=1e-4)
    for extra, match in (
        (["--variant", "context", "--router-layer", "-2"], "--router-layer applies"),
        (["--k", "2"], "--k apply with --variant context"),
        (["--init", "full"], "--init apply with --variant context"),
    ):
        res = runner.invoke(main, [*base, *extra])
        assert res.exit_code == 2 and match in res.output, res.output


def test_top_scope_trains_only_the_top_layers(deep_bert_dir: Path) -> None:
    model = transformers.AutoModel.from_pretrained(str(deep_bert_dir))
    router = ContextRouter(model, ContextConfig(k=1), trainable="top")
    router.freeze_backbone()
    trainable = {n for n, p in router.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(f"model.encoder.layer.{N_LAYERS - 1}.") for n in trainable)
    with pytest.raises(ValueError, match="outside"):
        ContextRouter(model, ContextConfig(k=N_LAYERS + 1))


def test_the_shipped_default_router_is_the_context_router_with_k_2() -> None:
    """The default chosen on issue 22's accuracy-cost table (benchmarks/paper/csr.md)."""
    from condsearch.base.artifact_files import DEFAULT_ROUTER_DIR
    from condsearch.base.model_sources import DEFAULT_MODEL
    from condsearch.model.artifacts.routers import router_model_id
    from condsearch.model.csr.context_weights import saved_context_config

    assert saved_context_config(DEFAULT_ROUTER_DIR) == ContextConfig(k=2)
    assert router_model_id(DEFAULT_ROUTER_DIR) == DEFAULT_MODEL
    assert sum(f.stat().st_size for f in DEFAULT_ROUTER_DIR.iterdir()) <= 10 * 2**20  # a small shipped artifact
