"""Knowledge-graph completion: data conventions, exact filtered ranking, SimKGC's loss, encoding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks._lib.kgclib.data import (
    NEIGHBOUR_NAMES,
    SHORT_DESCRIPTION_WORDS,
    KgData,
    entity_text,
    known_answers,
    link_graph,
    linked_texts,
    n_hop,
    read_kg,
    relation_text,
    with_inverse,
)
from benchmarks._lib.kgclib.ranking import (
    average_metrics,
    dense_filtered_ranks,
    filtered_ranks,
    query_filters,
    rank_metrics,
)
from benchmarks._lib.kgclib.training import KgcTrainConfig, PreBatch, batch_masks, simkgc_loss, train_kgc
from condsearch.base.faiss_indexes import build_index
from condsearch.errors import CorpusError
from tests.tolerance import assert_rows_close, mean_pooled, routed_tolerance, text_tolerance, unit_tolerance


def write_kg(folder: Path) -> Path:
    """A six-entity graph with two relations, in WN18RR's file layout."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {
        "e0": "dog, a domesticated animal that barks",
        "e1": "cat, a small domesticated animal",
        "e2": "animal, a living organism",
        "e3": "red, the color of blood",
        "e4": "blue, the color of the sky",
        "e5": "color, color",
    }
    (folder / "entity2text.txt").write_text("".join(f"{k}\t{v}\n" for k, v in texts.items()))
    (folder / "entities.txt").write_text("\n".join(texts) + "\n")
    (folder / "relations.txt").write_text("_hypernym\n_similar_to\n")
    (folder / "relation2text.txt").write_text("_hypernym\thypernym\n_similar_to\tsimilar to\n")
    (folder / "train.tsv").write_text("e0\t_hypernym\te2\ne1\t_hypernym\te2\ne3\t_hypernym\te5\ne0\t_similar_to\te1\n")
    (folder / "dev.tsv").write_text("e4\t_hypernym\te5\n")
    (folder / "test.tsv").write_text("e3\t_similar_to\te4\n")
    return folder


@pytest.fixture
def kg(tmp_path: Path):
    return read_kg(write_kg(tmp_path / "kg"))


# -- data --------------------------------------------------------------------------------------


def test_entity_and_relation_text_follow_simkgc() -> None:
    assert entity_text("dog", "a domesticated animal") == "dog: a domesticated animal"
    assert entity_text("color", "color") == "color"  # a description that only repeats the name
    assert entity_text("stool", "stool sample taken") == "stool: sample taken"
    assert relation_text("_member_of_domain_usage") == "member of domain usage"


def test_read_kg_maps_rows_and_conditions(kg) -> None:
    assert kg.n_entities == 6 and kg.n_relations == 2
    assert kg.entity_texts[0] == "dog: a domesticated animal that barks"
    assert kg.entity_texts[5] == "color"
    assert kg.conditions == ["hypernym", "similar to", "inverse hypernym", "inverse similar to"]
    np.testing.assert_array_equal(kg.splits["train"][0], [0, 0, 2])
    np.testing.assert_array_equal(kg.splits["test"], [[3, 1, 4]])


def test_read_kg_rejects_unknown_entities(tmp_path: Path) -> None:
    folder = write_kg(tmp_path / "kg")
    (folder / "dev.tsv").write_text("e9\t_hypernym\te5\n")
    with pytest.raises(CorpusError, match="unknown entity"):
        read_kg(folder)


def test_inverse_answers_and_graph(kg) -> None:
    train = kg.splits["train"]
    both = with_inverse(train, kg.n_relations)
    assert len(both) == 2 * len(train)
    np.testing.assert_array_equal(both[len(train)], [2, 2, 0])  # (animal, inverse hypernym, dog)
    answers = known_answers(kg.splits.values(), kg.n_relations)
    assert answers[(2, 2)] == {0, 1}
    assert answers[(5, 2)] == {3, 4}  # dev contributes too
    graph = link_graph(train, kg.n_entities)
    assert graph[2].tolist() == [0, 1] and graph[4].tolist() == []
    assert sorted(n_hop(graph, 0, 1).tolist()) == [0, 1, 2]
    assert sorted(n_hop(graph, 0, 5).tolist()) == [0, 1, 2]
    assert n_hop(graph, 0, 1, max_nodes=2).size == 0


def test_link_graph_texts_follow_simkgc(kg) -> None:
    linked = linked_texts(kg)
    # dog's training neighbours by id: e1 (cat), e2 (animal); blue (e4) has none in training
    assert linked.text(0) == "dog: a domesticated animal that barks cat animal"
    assert linked.text(0, leave_out=2) == "dog: a domesticated animal that barks cat"  # training: no label leak
    assert linked.text(4) == "blue: the color of the sky" == kg.entity_texts[4]
    assert linked.text(5) == "color: red"  # "color red" first loses the name it repeats
    assert linked.texts() == [linked.text(row) for row in range(kg.n_entities)]


def test_link_graph_texts_keep_ten_neighbours_by_id_and_spare_long_descriptions() -> None:
    ids = [f"x{i:02d}" for i in range(14)][::-1]  # rows in the reverse order of the ids
    hub = len(ids) - 1  # row 13 is "x00"
    train = np.array([[hub, 0, row] for row in range(hub)], dtype=np.int64)
    long = " ".join(["word"] * SHORT_DESCRIPTION_WORDS)
    data = KgData(
        entity_ids=ids,
        entity_texts=[],
        relations=["_r"],
        relation_texts=["r"],
        splits={"train": train},
        entity_names=[f"n{i}" for i in range(len(ids))],
        entity_descriptions=["short"] * (len(ids) - 1) + ["short"],
    )
    linked = linked_texts(data)
    first = linked.neighbours[hub].tolist()
    assert len(first) == NEIGHBOUR_NAMES and first == sorted(first, reverse=True)[:NEIGHBOUR_NAMES] == list(
        range(12, 2, -1)
    )  # x01..x10
    long_data = KgData(**{**data.__dict__, "entity_descriptions": ["short"] * (len(ids) - 1) + [long]})
    assert linked_texts(long_data).text(hub) == f"n{hub}: {long}"


# -- ranking -----------------------------------------------------------------------------------


def test_rank_metrics() -> None:
    m = rank_metrics(np.array([1, 2, 4, 20]))
    assert m["mrr"] == pytest.approx(100 * (1 + 0.5 + 0.25 + 0.05) / 4)
    assert (m["hit@1"], m["hit@3"], m["hit@10"], m["n"]) == (25.0, 50.0, 75.0, 4)
    avg = average_metrics(m, rank_metrics(np.array([1])))
    assert avg["hit@1"] == pytest.approx(62.5) and avg["n"] == 5


def test_dense_ranks_filter_and_bonus() -> None:
    scores = np.array([[0.9, 0.8, 0.7, 0.1]])
    assert dense_filtered_ranks(scores, np.array([2]), [np.empty(0, dtype=np.int64)])[0] == 3
    assert dense_filtered_ranks(scores, np.array([2]), [np.array([0])])[0] == 2  # a known answer removed
    ranked = dense_filtered_ranks(scores, np.array([2]), [np.array([0])], [np.array([2])], bonus=0.15)
    assert ranked[0] == 1  # 0.85 beats 0.8


@pytest.mark.parametrize("k", [1, 5, 40, 200])
@pytest.mark.parametrize("rerank", [False, True])
def test_faiss_ranks_equal_brute_force(k: int, rerank: bool) -> None:
    rng = np.random.default_rng(k)
    ents = rng.standard_normal((150, 16)).astype(np.float32)
    ents /= np.linalg.norm(ents, axis=1, keepdims=True)
    queries = ents[rng.integers(0, 150, 60)] + 0.7 * rng.standard_normal((60, 16)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    golds = rng.integers(0, 150, 60)
    filters = [rng.choice(150, size=rng.integers(0, 20), replace=False) for _ in range(60)]
    bonus = [rng.choice(150, size=30, replace=False) for _ in range(60)] if rerank else None
    expected = dense_filtered_ranks(queries @ ents.T, golds, filters, bonus, 0.05)
    got = filtered_ranks(build_index(ents), ents, queries, golds, filters, bonus_sets=bonus, bonus=0.05, k=k)
    np.testing.assert_array_equal(got, expected)
    assert expected.max() > k or k >= 40  # small k exercises the exact fallback


def test_query_filters_drop_the_gold(kg) -> None:
    answers = known_answers(kg.splits.values(), kg.n_relations)
    out = query_filters(np.array([2]), np.array([2]), np.array([0]), answers)
    assert out[0].tolist() == [1]


# -- loss --------------------------------------------------------------------------------------


def test_batch_masks() -> None:
    batch = np.array([[0, 0, 2], [1, 0, 2], [3, 0, 5], [2, 2, 0]])
    answers = {(0, 0): {2}, (1, 0): {2}, (3, 0): {5}, (2, 2): {0, 1, 2}}
    mask, self_mask = batch_masks(batch, answers)
    assert mask.diagonal().all()
    assert not mask[0, 1] and not mask[1, 0]  # same tail
    assert not mask[3, 1] and mask[3, 2]  # tail 2 is a known answer of (2, inverse): masked; 5 is not
    assert self_mask.tolist() == [True, True, True, False]  # entity 2 answers (2, 2) itself


def test_simkgc_loss_matches_hand_computation() -> None:
    torch.manual_seed(0)
    hr = torch.nn.functional.normalize(torch.randn(3, 4), dim=1)
    tails = torch.nn.functional.normalize(torch.randn(3, 4), dim=1)
    heads = torch.nn.functional.normalize(torch.randn(3, 4), dim=1)
    log_inv_t = torch.tensor(math.log(20.0))
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[0, 2] = False
    loss = simkgc_loss(hr, tails, heads, log_inv_t, margin=0.02, mask=mask, self_mask=torch.tensor([1, 1, 0]).bool())
    logits = (hr @ tails.T - 0.02 * torch.eye(3)) * 20.0
    logits[0, 2] = -1e4
    self_col = (hr * heads).sum(1) * 20.0
    self_col[2] = -1e4
    full = torch.cat([logits, self_col[:, None]], 1)
    expected = -torch.log_softmax(full, 1).diagonal().mean() - torch.log_softmax(logits.T, 1).diagonal().mean()
    torch.testing.assert_close(loss, expected)
    # perfect separation drives the loss towards zero
    eye = torch.eye(3, 4)
    low = simkgc_loss(eye, eye, -eye, log_inv_t, margin=0.0, mask=torch.ones(3, 3, dtype=torch.bool))
    assert low.item() < 1e-6


def test_pre_batch_tails_that_are_known_answers_are_masked() -> None:
    batch = np.array([[0, 0, 2], [1, 0, 3], [2, 2, 0]])
    answers = {(0, 0): {2}, (1, 0): {3}, (2, 2): {0, 1, 4}}
    mask, _ = batch_masks(batch, answers, np.array([2, 4, 5, 1]))  # the stored tails' entity ids
    assert mask.shape == (3, 3 + 4)
    np.testing.assert_array_equal(mask[:, :3], batch_masks(batch, answers)[0])  # in-batch columns unchanged
    assert mask[0, 3:].tolist() == [False, True, True, True]  # stored 2 is query 0's own tail
    assert mask[1, 3:].tolist() == [True, True, True, True]
    assert mask[2, 3:].tolist() == [True, False, True, False]  # 4 and 1 answer (2, 2) too: not negatives


def test_a_stored_tail_that_answers_the_query_is_no_negative() -> None:
    """In the loss, a stored tail masked as a known answer counts for nothing: as if never stored."""
    batch = np.array([[0, 0, 2], [1, 0, 3]])
    answers = {(0, 0): {2, 4}, (1, 0): {3, 4}}  # entity 4 answers both queries
    torch.manual_seed(0)
    hr, tails, heads = (torch.nn.functional.normalize(torch.randn(2, 4), dim=1) for _ in range(3))
    answer = torch.nn.functional.normalize(hr.sum(0, keepdim=True), dim=1)  # scores high against both
    other = torch.nn.functional.normalize(torch.randn(1, 4), dim=1)
    log_inv_t = torch.tensor(math.log(20.0))

    def loss(pre: torch.Tensor, pre_ids: np.ndarray, use_mask: bool = True) -> torch.Tensor:
        mask = torch.from_numpy(batch_masks(batch, answers, pre_ids)[0])
        pre_mask = mask[:, 2:] if use_mask else torch.ones(2, len(pre_ids), dtype=torch.bool)
        return simkgc_loss(hr, tails, heads, log_inv_t, margin=0.02, mask=mask[:, :2], pre=pre, pre_mask=pre_mask)

    with_answer = loss(torch.cat([answer, other]), np.array([4, 5]))
    torch.testing.assert_close(with_answer, loss(other, np.array([5])))
    assert loss(torch.cat([answer, other]), np.array([4, 5]), use_mask=False) > with_answer + 0.1
    # SimKGC's form: the stored logits scaled by the pre-batch weight (0.5), no margin on them
    in_logits = (hr @ tails.T - 0.02 * torch.eye(2)) * 20.0
    full = torch.cat([in_logits, hr @ other.T * 20.0 * 0.5, ((hr * heads).sum(1) * 20.0)[:, None]], 1)
    expected = -torch.log_softmax(full, 1).diagonal().mean() - torch.log_softmax(in_logits.T, 1).diagonal().mean()
    torch.testing.assert_close(loss(other, np.array([5])), expected)


def test_pre_batch_keeps_a_bounded_ring_of_detached_tails() -> None:
    ring = PreBatch(2)
    assert ring.stored() is None and len(ring) == 0
    for k in range(4):
        ring.push(torch.full((3, 2), float(k), requires_grad=True), np.arange(3) + 10 * k)
    stored = ring.stored()
    assert stored is not None and len(ring) == 6
    vectors, ids = stored
    assert not vectors.requires_grad and vectors[:, 0].tolist() == [2.0] * 3 + [3.0] * 3  # the last two, oldest first
    assert ids.tolist() == [20, 21, 22, 30, 31, 32]


def test_pre_batch_zero_gives_the_old_loss_exactly() -> None:
    """Pre-batch off (no stored tails) computes bit for bit what the loss computed before it existed."""
    torch.manual_seed(1)
    hr, tails, heads = (torch.nn.functional.normalize(torch.randn(5, 8), dim=1) for _ in range(3))
    log_inv_t = torch.tensor(math.log(20.0))
    batch = np.array([[0, 0, 2], [1, 0, 2], [3, 0, 5], [2, 2, 0], [4, 1, 3]])
    answers = {(0, 0): {2}, (1, 0): {2}, (3, 0): {5}, (2, 2): {0, 1, 2}, (4, 1): {3, 4}}
    mask_np, self_np = batch_masks(batch, answers)
    mask, self_mask = torch.from_numpy(mask_np), torch.from_numpy(self_np)
    # the loss as written before pre-batch negatives
    scale = log_inv_t.exp()
    logits = ((hr @ tails.T - 0.02 * torch.eye(5)) * scale).masked_fill(~mask, -1e4)
    self_logits = ((hr * heads).sum(dim=1) * scale).masked_fill(~self_mask, -1e4)
    labels = torch.arange(5)
    old = torch.nn.functional.cross_entropy(
        torch.cat([logits, self_logits[:, None]], dim=1), labels
    ) + torch.nn.functional.cross_entropy(logits.T, labels)
    new = simkgc_loss(hr, tails, heads, log_inv_t, margin=0.02, mask=mask, self_mask=self_mask)
    assert torch.equal(new, old)
    assert KgcTrainConfig().pre_batch == 0


# -- encoding and training on a tiny backbone ------------------------------------------------------


@pytest.fixture
def csr(tiny_bert_dir: Path, tmp_path: Path):
    from condsearch.model.csr import load_csr_encoder

    return load_csr_encoder(str(tiny_bert_dir), router="none", device="cpu", cache_dir=tmp_path / "cache")


def test_entity_vectors_are_the_plain_forward_pass(csr, kg) -> None:
    from transformers import AutoModel

    from benchmarks._lib.kgclib.encoding import entity_vectors, load_entity_states

    states = load_entity_states(csr, kg.entity_texts)
    got = entity_vectors(csr, states, chunk=2)  # several length-sorted chunks
    model = AutoModel.from_pretrained(csr.tokenizer.name_or_path).eval()
    inputs = csr.tokenizer(kg.entity_texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**inputs).last_hidden_state
    m = inputs["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=1).numpy()
    np.testing.assert_allclose(got, expected, atol=2e-3)  # states are cached in float16


def _query_tolerance(csr, kg, heads: np.ndarray, rels: np.ndarray) -> np.ndarray:
    """Return the tolerance of each unit query vector: its head routed under its relation, rounded in float32."""
    texts, conditions = [kg.entity_texts[h] for h in heads], [kg.conditions[r] for r in rels]
    return unit_tolerance(csr.encode(texts, conditions), routed_tolerance(csr, texts, conditions))


@pytest.mark.numerics
def test_queries_are_routed_in_the_order_given(csr, kg) -> None:
    from benchmarks._lib.kgclib.encoding import load_entity_states, query_vectors

    states = load_entity_states(csr, kg.entity_texts)
    heads, rels = np.array([5, 0, 3]), np.array([1, 0, 3])
    together = query_vectors(csr, states, heads, rels, kg.conditions)
    alone = np.vstack([query_vectors(csr, states, heads[i : i + 1], rels[i : i + 1], kg.conditions) for i in range(3)])
    assert_rows_close(together, alone, _query_tolerance(csr, kg, heads, rels))  # other batches, same values


def test_evaluate_and_train_run_end_to_end(csr, kg) -> None:
    from benchmarks._lib.kgclib.encoding import evaluate_link_prediction, load_entity_states

    states = load_entity_states(csr, kg.entity_texts)
    answers = known_answers(kg.splits.values(), kg.n_relations)
    before = {k: v.detach().clone() for k, v in csr.router.trainable_parameters().items()}
    scores = []
    config = KgcTrainConfig(epochs=2, batch_size=4, lr=1e-3, warmup_steps=1)

    def evaluate() -> dict[str, float]:
        out = evaluate_link_prediction(csr, states, kg, kg.splits["train"], answers, k=3)
        scores.append(float(out["mrr"]))
        return {"mrr": scores[-1], "condition_sensitivity": float(out["condition_sensitivity"])}

    history = train_kgc(csr, states, kg, config, evaluate=evaluate)
    assert [row["step"] for row in history] == [0, 2, 4]
    assert all(row["dev_condition_sensitivity"] >= 0 for row in history)
    assert all(math.isfinite(row["loss"]) for row in history[1:])
    after = csr.router.trainable_parameters()
    best = max(range(len(scores)), key=scores.__getitem__)
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    assert changed == (best > 0)  # the best-on-dev weights are the ones kept
    graph = link_graph(kg.splits["train"], kg.n_entities)
    out = evaluate_link_prediction(csr, states, kg, kg.splits["test"], answers, rerank_graph=graph)
    assert set(out) >= {"mrr", "hit@1", "hit@3", "hit@10", "n", "forward", "backward"}
    assert out["n"] == 2 and 0 < out["mrr"] <= 100


def test_two_towers_train_apart_and_reload(csr, kg, tmp_path: Path) -> None:
    from benchmarks._lib.kgclib.encoding import (
        TAIL_FOLDER,
        entity_vectors,
        load_entity_states,
        load_tail_tower,
        tail_tower,
    )
    from condsearch.model.csr.weights import save_router

    states = load_entity_states(csr, kg.entity_texts)
    tail = tail_tower(csr.router)
    np.testing.assert_allclose(entity_vectors(csr, states, tail=tail), entity_vectors(csr, states), atol=1e-6)
    frozen = {n: p.detach().clone() for n, p in tail.named_parameters() if "embeddings" in n}
    train_kgc(csr, states, kg, KgcTrainConfig(epochs=3, batch_size=4, lr=1e-2, warmup_steps=1), tail=tail)
    after = entity_vectors(csr, states, tail=tail)
    assert not np.allclose(after, entity_vectors(csr, states), atol=1e-4)  # the towers moved apart
    assert all(torch.equal(frozen[n], p) for n, p in tail.named_parameters() if n in frozen)
    save_router(csr.router, tmp_path / "r", {})
    save_router(tail, tmp_path / "r" / TAIL_FOLDER, {})
    again = load_tail_tower(csr.router, tmp_path / "r")
    assert again is not None and load_tail_tower(csr.router, tmp_path / "nothing") is None
    np.testing.assert_allclose(entity_vectors(csr, states, tail=again), after, atol=1e-3)  # saved as float16


def test_an_interrupted_run_resumes_to_the_same_weights(csr, kg, tmp_path: Path) -> None:
    from benchmarks._lib.kgclib.encoding import load_entity_states

    states = load_entity_states(csr, kg.entity_texts)
    start = {k: v.detach().clone() for k, v in csr.router.trainable_parameters().items()}
    config = KgcTrainConfig(epochs=2, batch_size=4, lr=1e-2, warmup_steps=1, checkpoint_every=1)

    def restart() -> None:
        with torch.no_grad():
            for k, p in csr.router.trainable_parameters().items():
                p.copy_(start[k])

    train_kgc(csr, states, kg, config)
    expected = {k: v.detach().clone() for k, v in csr.router.trainable_parameters().items()}

    class Stop(Exception):
        pass

    def stop_at_3(step: int, total: int, loss: float) -> None:
        if step == 3:
            raise Stop

    restart()
    with pytest.raises(Stop):
        train_kgc(csr, states, kg, config, checkpoint_dir=tmp_path / "ckpt", on_step=stop_at_3)
    restart()  # a new process: only the checkpoint remembers the first three steps
    train_kgc(csr, states, kg, config, checkpoint_dir=tmp_path / "ckpt", resume=True)
    for k, p in csr.router.trainable_parameters().items():
        torch.testing.assert_close(p, expected[k], atol=1e-6, rtol=1e-5)


# -- whole-backbone training (the context router, entities as token ids) ------------------------


@pytest.fixture
def context_csr(tiny_bert_dir: Path, tmp_path: Path):
    from condsearch.model.csr import load_csr_encoder
    from condsearch.model.csr.context import ContextConfig

    return load_csr_encoder(
        str(tiny_bert_dir),
        router="none",
        variant=ContextConfig(k=1),
        device="cpu",
        cache_dir=tmp_path / "cache",
        state_dtype=torch.float32,  # cached states as exact as token ids, so the two forms can be compared closely
    )


@pytest.mark.numerics
def test_token_ids_and_cached_states_give_the_same_vectors(context_csr, kg) -> None:
    from benchmarks._lib.kgclib.encoding import entity_tokens, entity_vectors, load_entity_states, query_vectors

    tokens, states = entity_tokens(context_csr, kg.entity_texts), load_entity_states(context_csr, kg.entity_texts)
    assert len(tokens) == len(states) == kg.n_entities
    np.testing.assert_array_equal(tokens.lengths(), states.lengths())
    # the lower layers run again from token ids, in other chunks: the same states up to rounding
    model, tokenizer, texts = context_csr.router.model, context_csr.tokenizer, kg.entity_texts
    tolerance = unit_tolerance(mean_pooled(model, tokenizer, texts), text_tolerance(model, tokenizer, texts))
    assert_rows_close(entity_vectors(context_csr, tokens, chunk=2), entity_vectors(context_csr, states), tolerance)
    heads, rels = np.array([0, 3, 5]), np.array([0, 1, 3])
    assert_rows_close(
        query_vectors(context_csr, tokens, heads, rels, kg.conditions),
        query_vectors(context_csr, states, heads, rels, kg.conditions),
        _query_tolerance(context_csr, kg, heads, rels),
    )


@pytest.mark.numerics
def test_a_training_batchs_loss_does_not_depend_on_its_chunks(context_csr, kg) -> None:
    """Length-sorted chunks of a batch pad less; each text's vector, so the loss, stays the same."""
    from benchmarks._lib.kgclib.data import known_answers, with_inverse
    from benchmarks._lib.kgclib.encoding import entity_tokens
    from benchmarks._lib.kgclib.training import batch_loss

    tokens = entity_tokens(context_csr, kg.entity_texts)
    assert tokens.ids.shape == (kg.n_entities, int(tokens.lengths().max()))
    train = kg.splits["train"]
    batch = with_inverse(train, kg.n_relations)[:8]
    answers = known_answers([train], kg.n_relations)
    log_inv_t = torch.tensor(math.log(20.0))
    context_csr.router.eval()  # no dropout: the chunks would draw other masks
    with torch.no_grad():
        losses = [
            float(batch_loss(context_csr, tokens, batch, kg.conditions, answers, log_inv_t, KgcTrainConfig(), None, c))
            for c in (2, 3, 256)
        ]
    assert losses[0] == pytest.approx(losses[2], rel=1e-4) and losses[1] == pytest.approx(losses[2], rel=1e-4)


def test_a_batchs_loss_takes_the_stored_tails_of_earlier_batches(context_csr, kg) -> None:
    """An empty buffer gives the loss without pre-batch negatives, bit for bit; each batch then
    stores its tails (ids and detached vectors), which the next batch's loss takes as negatives."""
    from benchmarks._lib.kgclib.encoding import entity_tokens
    from benchmarks._lib.kgclib.training import batch_loss

    train = kg.splits["train"]
    examples = with_inverse(train, kg.n_relations)
    answers = known_answers([train], kg.n_relations)
    log_inv_t = torch.tensor(math.log(20.0))
    tokens, config = entity_tokens(context_csr, kg.entity_texts), KgcTrainConfig(pre_batch=1)
    context_csr.router.eval()
    ring = PreBatch(config.pre_batch)

    def loss(batch: np.ndarray, pre: PreBatch | None) -> torch.Tensor:
        return batch_loss(context_csr, tokens, batch, kg.conditions, answers, log_inv_t, config, pre_batch=pre)

    first, second = examples[:4], examples[4:8]
    assert torch.equal(loss(first, ring), loss(first, None))
    stored = ring.stored()
    assert stored is not None and stored[1].tolist() == first[:, 2].tolist() and not stored[0].requires_grad
    assert not torch.equal(loss(second, ring), loss(second, None))
    stored = ring.stored()
    assert stored is not None and stored[1].tolist() == second[:, 2].tolist()  # one batch kept


@pytest.mark.numerics
def test_link_graph_training_reads_each_side_without_the_other(context_csr, kg) -> None:
    """With no neighbours to add, link-graph batches score as plain ones (the rows map back right);
    with neighbours, a head's text leaves its tail out and the tail's its head."""
    from benchmarks._lib.kgclib.data import LinkedTexts
    from benchmarks._lib.kgclib.encoding import entity_tokens
    from benchmarks._lib.kgclib.training import _linked_batch, batch_loss

    train = kg.splits["train"]
    batch = with_inverse(train, kg.n_relations)[:8]
    answers = known_answers([train], kg.n_relations)
    log_inv_t = torch.tensor(math.log(20.0))
    empty = [np.empty(0, dtype=np.int64)] * kg.n_entities
    bare = LinkedTexts(kg.entity_names, kg.entity_descriptions, empty)
    tokens, config = entity_tokens(context_csr, kg.entity_texts), KgcTrainConfig()
    context_csr.router.eval()
    with torch.no_grad():
        plain = float(batch_loss(context_csr, tokens, batch, kg.conditions, answers, log_inv_t, config))
        linked = float(batch_loss(context_csr, tokens, batch, kg.conditions, answers, log_inv_t, config, linked=bare))
    assert linked == pytest.approx(plain, rel=1e-4)
    source, where = _linked_batch(context_csr, linked_texts(kg), batch[:1, 0], batch[:1, 2])  # (dog, hypernym, animal)
    ids = source.ids[where]
    texts = [context_csr.tokenizer.decode(row[row != source.pad_id], skip_special_tokens=True) for row in ids]
    assert texts == ["animal : a living organism cat", "dog : a domesticated animal that barks cat"]


def test_whole_backbone_training_moves_every_layer_of_both_towers(context_csr, kg) -> None:
    from benchmarks._lib.kgclib.encoding import entity_tokens, load_entity_states, tail_tower

    router = context_csr.router
    tail = tail_tower(router)
    before = [{n: p.detach().clone() for n, p in t.model.named_parameters()} for t in (router, tail)]
    config = KgcTrainConfig(epochs=2, batch_size=4, lr=1e-2, warmup_steps=1)
    with pytest.raises(ValueError, match="token ids"):  # cached states would go stale as the lower layers move
        train_kgc(context_csr, load_entity_states(context_csr, kg.entity_texts), kg, config, tail=tail)
    history = train_kgc(context_csr, entity_tokens(context_csr, kg.entity_texts), kg, config, tail=tail)
    assert math.isfinite(history[-1]["loss"])
    for t, start in zip((router, tail), before, strict=True):
        moved = {
            n.split(".")[0] + "." + n.split(".")[1]
            for n, p in t.model.named_parameters()
            if not torch.equal(p, start[n])
        }
        assert {"embeddings.word_embeddings", "encoder.layer"} <= moved  # the bottom moved as well as the top


def test_a_frozen_token_table_stays_put_while_the_rest_trains(context_csr, kg) -> None:
    from benchmarks._lib.kgclib.encoding import entity_tokens, load_entity_states, tail_tower

    router = context_csr.router
    tail = tail_tower(router)
    table = "embeddings.word_embeddings.weight"
    before = [{n: p.detach().clone() for n, p in t.model.named_parameters()} for t in (router, tail)]
    config = KgcTrainConfig(epochs=1, batch_size=4, lr=1e-2, warmup_steps=1, freeze_token_table=True)
    train_kgc(context_csr, entity_tokens(context_csr, kg.entity_texts), kg, config, tail=tail)
    for t, start in zip((router, tail), before, strict=True):
        params = dict(t.model.named_parameters())
        assert torch.equal(params[table], start[table])
        assert not torch.equal(
            params["encoder.layer.0.attention.self.query.weight"], start["encoder.layer.0.attention.self.query.weight"]
        )
    # the cached-states form trains only the top layers, which hold no token table to freeze
    context_csr.router.trainable = "top"
    with pytest.raises(ValueError, match="token tables"):
        train_kgc(context_csr, load_entity_states(context_csr, kg.entity_texts), kg, config)


def test_a_two_tower_context_router_saves_within_budget_and_reloads(context_csr, kg, tmp_path: Path) -> None:
    from benchmarks._lib.kgclib.encoding import (
        entity_tokens,
        entity_vectors,
        load_tail_tower,
        query_vectors,
        save_towers,
        tail_tower,
    )
    from condsearch.model.csr import load_csr_encoder
    from condsearch.model.csr.context_weights import base_weights

    tokens = entity_tokens(context_csr, kg.entity_texts)
    tail = tail_tower(context_csr.router)
    train_kgc(context_csr, tokens, kg, KgcTrainConfig(epochs=2, batch_size=4, lr=1e-2, warmup_steps=1), tail=tail)
    base = base_weights(context_csr.source.location)
    exact = {n: p.detach().clone() for n, p in tail.model.named_parameters()}
    save_towers(context_csr, tail, base, tmp_path / "mid", {}, keep_weights=True)  # as a run saves its best
    assert all(torch.equal(p, exact[n]) for n, p in tail.model.named_parameters())  # training goes on unchanged
    assert (tmp_path / "mid" / "tail" / "router.safetensors").is_file()
    save_towers(context_csr, tail, base, tmp_path / "r", {"model_id": context_csr.model_id})
    heads, rels = np.array([0, 3]), np.array([0, 3])
    saved_q = query_vectors(context_csr, tokens, heads, rels, kg.conditions)  # the towers now hold what was saved
    saved_c = entity_vectors(context_csr, tokens, tail=tail)
    again = load_csr_encoder(context_csr.source.location, router=str(tmp_path / "r"), device="cpu")
    again_tail = load_tail_tower(again.router, tmp_path / "r", base)
    assert again_tail is not None
    np.testing.assert_allclose(query_vectors(again, tokens, heads, rels, kg.conditions), saved_q, atol=2e-3)
    np.testing.assert_allclose(entity_vectors(again, tokens, tail=again_tail), saved_c, atol=2e-3)
    size = sum(f.stat().st_size for f in (tmp_path / "r").rglob("*.safetensors"))
    assert size <= 10_000_000


def test_projected_training_keeps_the_weights_in_the_saved_form(context_csr, kg, tmp_path: Path, monkeypatch) -> None:
    import condsearch.model.csr.context_weights as context_weights
    from benchmarks._lib.kgclib.encoding import entity_tokens, project_towers, save_towers, tail_tower

    # a budget this small stores the tiny model's change compactly (low-rank int8, the token table as signs)
    monkeypatch.setattr(context_weights, "MAX_DELTA_BYTES", 60_000)
    tokens = entity_tokens(context_csr, kg.entity_texts)
    tail = tail_tower(context_csr.router)
    base = context_weights.base_weights(context_csr.source.location)
    projections: list[int] = []

    def project() -> None:
        projections.append(1)
        project_towers(context_csr, tail, base)

    def evaluate() -> dict[str, float]:
        return {"mrr": float(len(projections)), "condition_sensitivity": 0.0}  # each check is a new best

    config = KgcTrainConfig(epochs=1, batch_size=4, lr=1e-2, warmup_steps=1, project_every=2)
    train_kgc(context_csr, tokens, kg, config, tail=tail, evaluate=evaluate, project=project)
    steps = -(-2 * len(kg.splits["train"]) // 4)  # forward and inverse examples, batches of 4
    assert len(projections) == steps // 2 + 2  # every 2 steps, and before the start's and the epoch's dev checks
    towers = (context_csr.router, tail)
    held = [{n: p.detach().clone() for n, p in t.model.named_parameters()} for t in towers]
    save_towers(context_csr, tail, base, tmp_path / "r", {})  # the towers now hold exactly what was saved
    for tower, before in zip(towers, held, strict=True):
        for name, p in tower.model.named_parameters():
            change = (before[name] - base[name]).abs().max().item()
            # saving again moves a weight by its factors' int8 rounding at most (about 1% of its change), not more
            assert (p - before[name]).abs().max().item() <= 0.03 * change + 1e-7, name
    assert any(n.endswith(".qdelta_b") for n in load_weights_names(tmp_path / "r"))
    with pytest.raises(ValueError, match="needs a projection"):
        train_kgc(context_csr, tokens, kg, config, tail=tail)


def load_weights_names(folder: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "router.safetensors"), framework="pt") as f:
        return list(f.keys())


def test_a_checkpoints_best_dev_weights_load_into_fresh_towers(context_csr, kg, tmp_path: Path) -> None:
    from benchmarks._lib.kgclib.encoding import entity_tokens, tail_tower
    from benchmarks._lib.kgclib.training import load_best_weights
    from condsearch.errors import ModelError

    tokens = entity_tokens(context_csr, kg.entity_texts)
    router, tail = context_csr.router, tail_tower(context_csr.router)
    start = [{n: p.detach().clone() for n, p in t.trainable_parameters().items()} for t in (router, tail)]
    scores = iter([1.0, 3.0, 7.0, 2.0, 4.0, 5.0, 6.0, 0.5, 0.5, 0.5])  # the best (7.0) is not the last

    def evaluate() -> dict[str, float]:
        return {"mrr": next(scores), "condition_sensitivity": 0.0}

    config = KgcTrainConfig(epochs=2, batch_size=4, lr=1e-2, warmup_steps=1, checkpoint_every=1)
    history = train_kgc(
        context_csr, tokens, kg, config, tail=tail, evaluate=evaluate, eval_every=1, checkpoint_dir=tmp_path / "ck"
    )
    assert max(r["dev"] for r in history) == 7.0 and history[-1]["dev"] != 7.0
    best = [{n: p.detach().clone() for n, p in t.trainable_parameters().items()} for t in (router, tail)]
    with torch.no_grad():  # a fresh process: the towers hold the base model again
        for t, values in zip((router, tail), start, strict=True):
            for n, p in t.trainable_parameters().items():
                p.copy_(values[n])
    row, config_saved = load_best_weights(tmp_path / "ck", router, tail)
    assert row["dev"] == 7.0 and isinstance(config_saved, dict) and config_saved["towers"] == 2
    for t, values in zip((router, tail), best, strict=True):
        for n, p in t.trainable_parameters().items():
            assert torch.equal(p, values[n]), n
    with pytest.raises(ModelError, match="does not hold these towers"):
        load_best_weights(tmp_path / "ck", router, None)  # a one-tower router cannot take a two-tower run
    with pytest.raises(ModelError, match="no training checkpoint"):
        load_best_weights(tmp_path, router, tail)


class _Tower:
    """A backbone with every parameter but the pooler trainable, as a whole-backbone context router names them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if not n.startswith("pooler.")}


def test_projection_probe_splits_what_a_projection_loses(tiny_bert_dir: Path) -> None:
    from transformers import AutoModel

    from benchmarks._lib.kgclib.projection_probe import PARTS, tower_losses
    from condsearch.model.csr.compact_delta import decode
    from condsearch.model.csr.context_weights import backbone_delta

    model = AutoModel.from_pretrained(str(tiny_bert_dir))
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("pooler.") and (p.ndim == 2 or "LayerNorm" in name):
                p.add_(0.01 * torch.randn(p.shape, generator=generator))
    tower = _Tower(model)
    before = {n: p.detach().clone() for n, p in tower.trainable_parameters().items()}
    with torch.no_grad():
        next(iter(tower.trainable_parameters().values())).add_(0.5)  # an update of the token table alone
    budget = 20_000  # well under the whole change's float16 size: factors and sign-coded rows
    delta, rank = backbone_delta(base, model, max_bytes=budget)
    assert rank is not None and any(k.endswith(".sdelta_rows") for k in delta)
    losses = tower_losses(tower, before, base, budget)
    table = next(iter(tower.trainable_parameters().values()))
    assert losses["update"] == pytest.approx(0.25 * table.numel(), rel=1e-4)
    assert losses["token_table_update"] == pytest.approx(losses["update"])
    assert all(losses[k] > 0 for k in ("token_table", "rank_cut", "rounding"))
    # the parts add up to all that the artifact's form takes away from the weights
    kept = decode(delta, {n: tuple(p.shape) for n, p in model.named_parameters()})
    lost = 0.0
    for name, p in tower.trainable_parameters().items():
        change = p.detach() - base[name]
        if f"{name}.delta_b" in kept:
            change = change - kept[f"{name}.delta_b"] @ kept[f"{name}.delta_a"]
        elif f"{name}.delta" in kept:
            change = change - kept[f"{name}.delta"].float()
        lost += float(change.pow(2).sum())
    assert sum(losses[k] for k in PARTS) == pytest.approx(lost, rel=1e-3)
