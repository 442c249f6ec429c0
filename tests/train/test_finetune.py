"""Fine-tuning: LoRA layers, adapter folders, objectives, checkpoints and the CLI, on the tiny BERT."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from condsearch.base.artifact_files import PEFT_WEIGHTS as ADAPTER_FILE
from condsearch.cli import main
from condsearch.corpus.csts import CstsData
from condsearch.errors import ModelError
from condsearch.model.artifacts.adapters import has_adapter
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.vectorizer import load_vectorizer, resolve_head
from condsearch.store.folder import MANIFEST
from condsearch.train.adapter import save_adapter
from condsearch.train.finetune import FinetuneConfig, case_forward, fit_encoder, prepare, trainable_parameters
from condsearch.train.lora import LoraConfig, LoraLinear, add_lora, lora_state
from condsearch.train.losses import (
    LossSettings,
    bcl_loss,
    combined_loss,
    group_positions,
    pair_groups,
    parse_loss_spec,
    quadruplet_loss,
    wacl_loss,
)

COLOUR = "color of the dress"
SPORT = "the sport being played"
PAIRS = [
    ("a girl in a red dress", "a woman in a red dress", COLOUR, 5, SPORT, 2),
    ("two men play soccer", "a boy plays soccer", SPORT, 5, COLOUR, 1),
    ("a man in a green hat", "a boy in a green shirt", COLOUR, 4, SPORT, 1),
    ("a dog runs on the beach", "a cat runs on the beach", "the animal", 2, "the place", 5),
    ("a girl plays golf", "a girl swims in the pool", "the place", 3, SPORT, 1),
    ("a boy rides a bike", "a man rides a horse", "the animal", 1, "the vehicle", 3),
]
TEXTS = ["a girl in an orange dress serves the ball", "two men play soccer on a grass field"]


def _rows() -> list[tuple[str, str, str, int]]:
    """Each sentence pair twice, under a higher- and a lower-similarity condition (as in C-STS)."""
    return [r for a, b, c1, y1, c2, y2 in PAIRS for r in ((a, b, c1, y1), (a, b, c2, y2))]


def _data() -> CstsData:
    rows = _rows()
    return CstsData(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], np.array([r[3] for r in rows], np.float32)
    )


@pytest.fixture
def train_csv(tmp_path: Path) -> Path:
    path = tmp_path / "train.csv"
    path.write_text("sentence1,sentence2,condition,label\n" + "".join(f"{a},{b},{c},{y}\n" for a, b, c, y in _rows()))
    return path


def _encoder(folder: Path, adapter: Path | None = None):  # noqa: ANN202 - a BertStyleEncoder
    return load_encoder(EncoderSpec(str(folder), adapter=adapter, runtime=Runtime(device="cpu")))


def _lora(**kw: object) -> FinetuneConfig:
    return FinetuneConfig(
        **{"kind": "lora", "epochs": 2, "batch_size": 4, "lr": 1e-2, "lora": LoraConfig(rank=2), **kw}
    )


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result


# --- LoRA layers ---------------------------------------------------------------------------


def test_fresh_lora_leaves_the_model_exactly_as_it_was(tiny_bert_dir: Path) -> None:
    enc = _encoder(tiny_bert_dir)
    pairs = [(COLOUR, TEXTS[0]), (SPORT, TEXTS[1]), (COLOUR, None)]
    before = enc.encode_batch(pairs)
    wrapped = add_lora(enc.model, LoraConfig(rank=4, dropout=0.0))
    assert len(wrapped) == 12  # 6 projections x 2 layers
    assert all(isinstance(enc.model.get_submodule(n), LoraLinear) for n in wrapped)
    np.testing.assert_array_equal(enc.encode_batch(pairs), before)
    assert "adapter_checksum" not in enc.describe()  # no adapter loaded from disk: describe() unchanged


def test_targets_select_projections(tiny_bert_dir: Path) -> None:
    enc = _encoder(tiny_bert_dir)
    wrapped = add_lora(enc.model, LoraConfig(rank=2, targets=("query", "ffn_out")))
    assert sorted({n.split(".", 3)[-1] for n in wrapped}) == ["attention.self.query", "output.dense"]
    with pytest.raises(ValueError, match="targets"):
        LoraConfig(targets=("nope",))


def test_only_adapter_and_head_parameters_get_gradients(tiny_bert_dir: Path) -> None:
    enc = _encoder(tiny_bert_dir)
    head = prepare(enc, _lora(head_on_top=True, head_dim=4))
    enc.model.train()
    vecs = head(case_forward(enc, TEXTS, [COLOUR, SPORT]))
    vecs.square().sum().backward()
    for name, p in enc.model.named_parameters():
        if ".lora_" in name:
            assert p.requires_grad and p.grad is not None, name
        else:
            assert not p.requires_grad and p.grad is None, name
    assert any(p.grad.abs().sum() > 0 for n, p in enc.model.named_parameters() if n.endswith("lora_b"))
    assert all(p.grad is not None for p in head.parameters())
    names = set(trainable_parameters(enc, head))
    assert names == {f"encoder.{k}" for k in lora_state(enc.model)} | {"head.linear.weight"}


def test_full_finetune_trains_every_weight(tiny_bert_dir: Path) -> None:
    enc = _encoder(tiny_bert_dir)
    prepare(enc, FinetuneConfig(kind="full"))
    assert all(p.requires_grad for p in enc.model.parameters())
    assert len(trainable_parameters(enc, None)) == len(list(enc.model.parameters()))


# --- adapter folders -----------------------------------------------------------------------


def _trained_adapter(tiny_bert_dir: Path, out: Path, seed: int = 0):  # noqa: ANN202
    enc = _encoder(tiny_bert_dir)
    torch.manual_seed(seed)
    config = LoraConfig(rank=2)
    add_lora(enc.model, config)
    with torch.no_grad():
        for name, p in lora_state(enc.model).items():
            if name.endswith("lora_b"):
                p.normal_(0, 0.5)
    enc.model.eval()
    save_adapter(enc, config, out)
    return enc


def test_adapter_save_load_round_trip(tiny_bert_dir: Path, tmp_path: Path) -> None:
    trained = _trained_adapter(tiny_bert_dir, tmp_path / "ad")
    assert has_adapter(tmp_path / "ad")
    loaded = _encoder(tiny_bert_dir, adapter=tmp_path / "ad")
    # loading merges the adapter into the base weights: the same function up to rounding, no LoRA layers left
    assert not any(isinstance(m, LoraLinear) for m in loaded.model.modules())
    np.testing.assert_allclose(loaded.encode(TEXTS, COLOUR), trained.encode(TEXTS, COLOUR), rtol=1e-4, atol=1e-4)
    plain = _encoder(tiny_bert_dir).encode(TEXTS, COLOUR)
    assert not np.allclose(plain, loaded.encode(TEXTS, COLOUR))  # the adapter matters
    digest = hashlib.sha256((tmp_path / "ad" / ADAPTER_FILE).read_bytes()).hexdigest()
    assert loaded.describe()["adapter_checksum"] == digest
    assert "adapter_checksum" not in _encoder(tiny_bert_dir).describe()


def test_adapter_refused_on_another_model_and_without_loading(
    tiny_bert_dir: Path, other_bert_dir: Path, tmp_path: Path
) -> None:
    _trained_adapter(tiny_bert_dir, tmp_path / "ad")
    with pytest.raises(ModelError, match="trained for"):
        _encoder(other_bert_dir, adapter=tmp_path / "ad")
    with pytest.raises(ModelError, match="not loaded with"):
        resolve_head(str(tmp_path / "ad"), _encoder(tiny_bert_dir))
    vec = load_vectorizer(EncoderSpec(str(tiny_bert_dir), head=str(tmp_path / "ad"), runtime=Runtime(device="cpu")))
    assert vec.head is None and vec.dim == 32 and vec.profile_name == str((tmp_path / "ad").resolve())


# --- objectives ----------------------------------------------------------------------------


def test_quadruplet_loss_by_hand() -> None:
    got = quadruplet_loss(torch.tensor([0.9, 0.2]), torch.tensor([0.1, 0.5]), margin=1.0)
    assert got.item() == pytest.approx((0.2 + 1.3) / 2)  # max(1 + 0.1 - 0.9, 0), max(1 + 0.5 - 0.2, 0)


def test_wacl_loss_by_hand() -> None:
    got = wacl_loss(
        torch.tensor([0.8, 0.6]), torch.tensor([0.3, 0.1]), torch.tensor([1.0, 0.5]), torch.tensor([0.25, 0.5])
    )
    assert got.item() == pytest.approx((0.75 * abs(0.75 + 0.3 - 0.8) + 0.0) / 2)


def test_bcl_loss_by_hand() -> None:
    anchor = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positive = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    negative = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    labels = torch.tensor([0.25, 0.75])
    got = bcl_loss(anchor, positive, negative, labels, temperature=1.0, sigma=0.5)
    e = math.e
    # row 0: own negative (cos 0) weighs 1 - 0.25; the other row's (cos 1) weighs 1
    row0 = -math.log(e / (e + 0.75 * 1.0 + e))
    # row 1: own negative is dropped (label 0.75 >= sigma); the other's has cos 1
    pos1 = math.exp(1 / math.sqrt(2))
    row1 = -math.log(pos1 / (pos1 + e))
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)


def test_combined_loss_weights_terms() -> None:
    cos = torch.tensor([0.9, 0.1, 0.5])
    y = torch.tensor([1.0, 0.0, 0.5])
    positions = group_positions([[0, 1], [2]])
    settings = LossSettings({"mse": 2.0, "quad": 0.5})
    total, terms = combined_loss(settings, cos, y, positions)
    mse = ((0.1**2) + (0.1**2) + 0.0) / 3
    quad = 1.0 + 0.1 - 0.9
    assert terms == pytest.approx({"mse": mse, "quad": quad})
    assert total.item() == pytest.approx(2 * mse + 0.5 * quad)


def test_parse_loss_spec() -> None:
    assert parse_loss_spec("mse") == {"mse": 1.0}
    assert parse_loss_spec("mse+wacl") == {"mse": 1.0, "wacl": 1.0}
    assert parse_loss_spec("mse=1, bcl=0.25") == {"mse": 1.0, "bcl": 0.25}
    for bad in ("nope", "mse=x", "mse,mse", "mse=-1", "mse=0", ""):
        with pytest.raises(ValueError):
            parse_loss_spec(bad)


def test_pair_groups_batch_both_conditions_together() -> None:
    groups = pair_groups(_data())
    assert len(groups) == len(PAIRS) and all(len(g) == 2 for g in groups)
    labels = _data().labels
    assert all(labels[g[0]] >= labels[g[1]] for g in groups)


# --- training and checkpoints --------------------------------------------------------------


class _Stop(Exception):
    pass


def test_resume_continues_at_the_next_epoch(tiny_bert_dir: Path, tmp_path: Path) -> None:
    data = _data()
    config = _lora(losses=(("mse", 1.0), ("wacl", 1.0), ("bcl", 0.5)), head_on_top=True, head_dim=4)

    straight = _encoder(tiny_bert_dir)
    result = fit_encoder(straight, data, config, dev=data, checkpoint_dir=tmp_path / "a")
    assert [int(r["epoch"]) for r in result.history] == [1, 2]

    def crash(epoch: int, row: dict[str, float]) -> None:
        if epoch == 1:
            raise _Stop

    with pytest.raises(_Stop):
        fit_encoder(_encoder(tiny_bert_dir), data, config, dev=data, checkpoint_dir=tmp_path / "b", on_epoch=crash)
    seen: list[int] = []
    resumed_enc = _encoder(tiny_bert_dir)
    resumed = fit_encoder(
        resumed_enc,
        data,
        config,
        dev=data,
        checkpoint_dir=tmp_path / "b",
        resume=True,
        on_epoch=lambda e, r: seen.append(e),
    )
    assert seen == [2] and resumed.resumed_from == 1
    assert [int(r["epoch"]) for r in resumed.history] == [1, 2]
    assert resumed.best_epoch == result.best_epoch
    a, b = trainable_parameters(straight, result.head), trainable_parameters(resumed_enc, resumed.head)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    # another config is refused rather than mixed in
    with pytest.raises(ModelError, match="other settings"):
        fit_encoder(_encoder(tiny_bert_dir), data, _lora(lr=1e-3), checkpoint_dir=tmp_path / "b", resume=True)
    # and so are other training rows under the same settings
    with pytest.raises(ModelError, match="other settings"):
        fit_encoder(_encoder(tiny_bert_dir), data.head(6), config, checkpoint_dir=tmp_path / "b", resume=True)


def test_quad_alone_skips_a_batch_without_both_conditions(tiny_bert_dir: Path) -> None:
    # two sentence pairs, each under one condition only: no (high, low) group for quad to compare
    single = CstsData(
        ["a girl in red", "two men"], ["a woman in red", "a boy"], [COLOUR, SPORT], np.array([5, 4], np.float32)
    )
    result = fit_encoder(_encoder(tiny_bert_dir), single, _lora(losses=(("quad", 1.0),), epochs=1))
    assert [int(r["epoch"]) for r in result.history] == [1] and result.history[0]["loss"] == 0


# --- command line --------------------------------------------------------------------------


def test_cli_train_lora_then_index_and_query(
    tiny_bert_dir: Path, corpus_file: Path, train_csv: Path, tmp_path: Path
) -> None:
    out, index_dir = tmp_path / "lora", tmp_path / "indexes"
    common = ["--model", tiny_bert_dir, "--lora-rank", 2, "--epochs", 1, "--lr", 1e-2]
    summary = json.loads(
        ok(
            run(
                "train",
                "lora",
                train_csv,
                "--out",
                out,
                "--dev",
                train_csv,
                *common,
                "--head-on-top",
                "--dim",
                4,
                "--loss",
                "mse=1,quad=0.5",
                "--json",
            )
        ).stdout
    )  # noqa: E501
    assert summary["finetune"] == "lora" and summary["best_epoch"] == 1 and summary["config"]["losses"]["quad"] == 0.5
    assert summary["checkpoint_dir"] is None and not (out / "checkpoint.json").exists()  # the default one is removed
    ok(run("index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--head", out, "--index-dir", index_dir))
    manifest = json.loads(next(index_dir.glob(f"*/{MANIFEST}")).read_text())
    assert manifest["dim"] == 4 and manifest["head"] == str(out.resolve())
    assert manifest["encoder"]["adapter_checksum"] == hashlib.sha256((out / ADAPTER_FILE).read_bytes()).hexdigest()
    hits = json.loads(ok(run("query", TEXTS[0], "-c", COLOUR, "-k", 3, "--index-dir", index_dir, "--json")).stdout)
    assert len(hits["results"]) == 3

    # retrain into the same folder: the index's adapter no longer matches and the query is refused
    ok(run("train", "lora", train_csv, "--out", out, *common, "--head-on-top", "--dim", 4, "--seed", 1))
    refused = run("query", TEXTS[0], "-c", COLOUR, "--index-dir", index_dir)
    assert refused.exit_code == 1 and "built with adapter sha256" in refused.stderr
    assert "Traceback" not in refused.output


def test_cli_full_finetune_writes_a_model_folder(tiny_bert_dir: Path, train_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "full"
    ok(
        run(
            "train",
            "full",
            train_csv,
            "--out",
            out,
            "--model",
            tiny_bert_dir,
            "--epochs",
            1,
            "--head-on-top",
            "--dim",
            4,
        )
    )  # noqa: E501
    vec = load_vectorizer(EncoderSpec(str(out), head=str(out), runtime=Runtime(device="cpu")))
    assert vec.encoder.model_id == str(out.resolve()) and vec.dim == 4
    assert vec.encode(TEXTS, COLOUR).shape == (2, 4)


def test_init_head_starts_where_the_frozen_encoder_and_head_were(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from condsearch.model.head import HeadConfig, ProjectionHead, save_head

    enc = _encoder(tiny_bert_dir)
    torch.manual_seed(3)
    start = ProjectionHead(HeadConfig(input_dim=enc.dim, dim=8, model_id=enc.model_id)).eval()
    save_head(start, tmp_path / "start")
    frozen = start.project(enc.encode(TEXTS, COLOUR))
    head = prepare(enc, _lora(head_on_top=True, head_dim=8, init_head=str(tmp_path / "start")))
    assert head is not None
    torch.testing.assert_close(head.linear.weight, start.linear.weight.to(head.linear.weight.device))
    np.testing.assert_allclose(head.project(enc.encode(TEXTS, COLOUR)), frozen, rtol=1e-5, atol=1e-6)
    with pytest.raises(ModelError, match="set --dim"):
        prepare(_encoder(tiny_bert_dir), _lora(head_on_top=True, head_dim=4, init_head=str(tmp_path / "start")))
    with pytest.raises(ValueError, match="head_on_top"):
        _lora(init_head=str(tmp_path / "start"))


def test_csts_benchmark_scores_an_adapter_folder(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from benchmarks.paper import csts

    _trained_adapter(tiny_bert_dir, tmp_path / "ad")
    argv = [
        "--smoke",
        "--model",
        str(tiny_bert_dir),
        "--head",
        str(tmp_path / "ad"),
        "--json-out",
        str(tmp_path / "r.json"),
    ]
    assert csts.main(argv) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert "adapter_checksum" in result["config"]["encoder"] and result["config"]["dim"] == 32
