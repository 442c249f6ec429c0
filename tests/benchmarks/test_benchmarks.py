"""Every benchmark script's --smoke mode runs (tiny model, synthetic data) and writes its JSON."""

from __future__ import annotations

import importlib
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
GROUPS = ("_lib", "paper", "systems", "studies")


def load_script(name: str):
    """Import the benchmark module called name (``benchmarks.<group>.<name>``) from whichever group holds it."""
    (group,) = [g for g in GROUPS if (BENCHMARKS / g / f"{name}.py").is_file()]
    return importlib.import_module(f"benchmarks.{group}.{name}")


@pytest.fixture(scope="module")
def smoke_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    common = load_script("common")
    return common.write_csts_csv(common.synthetic_csts(64), tmp_path_factory.mktemp("csv") / "smoke.csv")


def _run(name: str, argv: list[str], out: Path) -> dict:
    assert load_script(name).main([*argv, "--json-out", str(out)]) == 0
    return json.loads(out.read_text())


def test_isotropy_separates_spread_from_crowded_vectors() -> None:
    iso = load_script("isotropy")
    rng = np.random.default_rng(0)
    spread = rng.standard_normal((2000, 8))
    crowded = np.ones((2000, 8)) + 0.05 * rng.standard_normal((2000, 8))
    high, low = iso.isotropy(spread), iso.isotropy(crowded)
    assert 0 < low < high <= 1 and high > 0.9 and low < 0.3
    assert iso.isotropy(spread, seed=1) == pytest.approx(high, abs=0.05)
    assert iso.cosine_to_mean(crowded)["mean"] > 0.99 > iso.cosine_to_mean(spread)["mean"]


@pytest.mark.parametrize("mode", ["case", "unconditional", "csr"])
def test_csts_smoke(mode: str, tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--mode", mode, "--model", str(tiny_bert_dir)]
    if mode != "csr":
        argv += ["--dims", "8,16"]
    result = _run("csts", argv, tmp_path / "out.json")
    extra = {"condition_sensitivity"} if mode == "csr" else set()
    assert set(result["dev"]) == {"spearman", "pearson", "n"} | extra and result["config"]["mode"] == mode
    if mode != "csr":
        assert [row["dim"] for row in result["dim_sweep"]] == [8, 16]
    if mode == "case":
        assert set(result["isotropy"]["i_iso"]) == {"cond", "cond_minus_c"}
        assert 0 < result["isotropy"]["i_iso"]["cond_minus_c"] <= 1


def test_csts_full_mode_needs_files() -> None:
    with pytest.raises(SystemExit):
        load_script("csts").parse_args(["--mode", "case"])


def test_kgc_smoke_trains_and_ranks(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--train", "--model", str(tiny_bert_dir), "--save", str(tmp_path / "router"), "--rerank"]
    result = _run("kgc", argv, tmp_path / "out.json")
    assert {"mrr", "hit@1", "hit@3", "hit@10", "n", "forward", "backward"} <= set(result)
    assert result["n"] == result["forward"]["n"] + result["backward"]["n"] > 0
    assert result["config"]["rerank"] and result["training"]["history"][0]["step"] == 0
    assert (tmp_path / "router" / "router.safetensors").is_file()
    # the saved router loads back for evaluation alone
    again = _run(
        "kgc", ["--smoke", "--model", str(tiny_bert_dir), "--router", str(tmp_path / "router")], tmp_path / "b"
    )
    assert again["config"]["router_checksum"] == result["config"]["router_checksum"]


def test_kgc_refuses_projection_where_nothing_is_saved_compactly() -> None:
    kgc = load_script("kgc")
    for argv in (
        ["--project-every", "5"],
        ["--train", "--frozen-lower", "--project-every", "5"],
        ["--freeze-token-table"],
        ["--train", "--frozen-lower", "--freeze-token-table"],
    ):
        with pytest.raises(SystemExit):
            kgc.parse_args(["--smoke", *argv])
    assert kgc.parse_args(["--smoke", "--train", "--project-every", "5"]).project_every == 5
    assert kgc.parse_args(["--smoke", "--train", "--freeze-token-table"]).freeze_token_table


def test_kgc_scores_a_runs_checkpoint_exactly_and_as_saved(tiny_bert_dir: Path, tmp_path: Path) -> None:
    model, ck = ["--smoke", "--model", str(tiny_bert_dir)], str(tmp_path / "ck")
    trained = _run("kgc", [*model, "--train", "--checkpoint-dir", ck], tmp_path / "a")
    best = max(trained["training"]["history"], key=lambda row: row["dev"])
    exact = _run("kgc", [*model, "--weights-from", ck], tmp_path / "b")
    assert exact["checkpoint"]["best_dev"]["step"] == best["step"] and exact["config"]["router_checksum"] is None
    assert exact["mrr"] == pytest.approx(trained["mrr"])  # the run scored its best weights after training
    saved = _run("kgc", [*model, "--weights-from", ck, "--save", str(tmp_path / "r")], tmp_path / "c")
    again = _run("kgc", [*model, "--router", str(tmp_path / "r")], tmp_path / "d")
    assert again["config"]["router_checksum"] == saved["config"]["router_checksum"] is not None
    assert again["mrr"] == pytest.approx(saved["mrr"])
    assert load_script("kgc").main([*model, "--train", "--weights-from", ck]) == 1  # one line: train or score


def test_kgc_link_graph_texts_are_recorded_and_read_back(tiny_bert_dir: Path, tmp_path: Path) -> None:
    model, ck, router = ["--smoke", "--model", str(tiny_bert_dir)], str(tmp_path / "ck"), str(tmp_path / "r")
    trained = _run("kgc", [*model, "--train", "--link-graph", "--checkpoint-dir", ck], tmp_path / "a")
    exact = _run("kgc", [*model, "--weights-from", ck], tmp_path / "b")  # the checkpoint says how it trained
    assert trained["config"]["link_graph"] and exact["config"]["link_graph"]
    assert exact["mrr"] == pytest.approx(trained["mrr"])
    saved = _run("kgc", [*model, "--weights-from", ck, "--save", router], tmp_path / "c")
    again = _run("kgc", [*model, "--router", router], tmp_path / "d")  # and so does the saved router
    assert again["config"]["link_graph"] and again["mrr"] == pytest.approx(saved["mrr"])
    assert not _run("kgc", [*model, "--router", router, "--no-link-graph"], tmp_path / "e")["config"]["link_graph"]
    assert load_script("kgc").main([*model, "--train", "--frozen-lower", "--link-graph"]) == 1  # one line


def test_kgc_profile_times_float32_and_bf16_steps_per_chunk_size(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--train", "--model", str(tiny_bert_dir), "--profile-steps", "1", "--profile-chunks", "2,64"]
    prof = _run("kgc", argv, tmp_path / "out.json")["profile"]
    assert set(prof["settings"]) == {f"{d}, chunks of {c}" for d in ("float32", "bf16") for c in (2, 64)}
    for row in prof["settings"].values():
        assert row["seconds_per_step_median"] > 0 and row["examples_per_second"] > 0
    assert prof["steps_timed_per_setting"] == 2 and prof["entity_tokens"]["mean"] > 0
    profiled = prof["profiled"]  # the work outside the model, timed by torch's profiler
    assert {"kgc.batch_inputs", "kgc.batch_masks", "kgc.condition_tokens"} <= set(profiled["seconds_outside_the_model"])
    assert 0 < profiled["share_outside_the_model"] < 1


def test_latency_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    plotting = importlib.util.find_spec("matplotlib") is not None  # without it --plot exits 2 (test_latency_plot)
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--dims", "8,16"]
    argv += ["--plot", str(tmp_path / "p.png")] if plotting else []
    result = _run("latency", argv, tmp_path / "out.json")
    dims = {(row["dim"], row["n"]) for row in result["rows"]}
    assert dims == {(d, n) for d in (8, 16, 512) for n in (1000, 4000)}
    row = result["rows"][0]
    assert {"p50", "p95"} <= set(row["search_ms"]["batch1"]) and row["bytes_per_vector"] == 4 * row["dim"]
    assert "dev_spearman" in row and "dev_spearman" not in result["rows"][-1]
    assert result["csr_new_condition_speedup"] > 0
    llc = result["last_level_cache_bytes"]
    for r in result["rows"]:  # a fraction of memory bandwidth only where the index cannot sit in cache
        fits = llc is None or r["n"] * r["dim"] * 4 <= llc
        assert (r["bandwidth_fraction"] is None) == fits and (fits or r["bandwidth_fraction"] > 0)
    heads = [r for r in result["rows"] if r["source"] == "head"]
    assert (result["search_bandwidth_fraction"] is None) == all(r["bandwidth_fraction"] is None for r in heads)
    assert result["encode"]["peer"]["texts_per_s"] > 0
    assert (tmp_path / "p.png").is_file() or not plotting


def test_latency_caps_index_memory(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--dims", "8", "--max-index-gib", "0.005", "--no-peer"]
    result = _run("latency", argv, tmp_path / "out.json")
    assert {"dim": 512, "n": 4000, "index_gib": 0.01} in result["skipped"]
    assert all(r["n"] * r["dim"] * 4 <= 0.005 * 2**30 for r in result["rows"])


@pytest.mark.parametrize("name", ["index_throughput", "csr_speedup"])
def test_throughput_scripts_smoke(name: str, tiny_bert_dir: Path, smoke_csv: Path, tmp_path: Path) -> None:
    result = _run(name, ["--smoke", "--csv", str(smoke_csv), "--model", str(tiny_bert_dir)], tmp_path / "o.json")
    assert result["config"]["smoke"] is True


def test_index_throughput_against_sentence_transformers_smoke(
    tiny_bert_dir: Path, smoke_csv: Path, tmp_path: Path
) -> None:
    pytest.importorskip("sentence_transformers")
    argv = ["--smoke", "--against-st", "--csv", str(smoke_csv), "--model", str(tiny_bert_dir), "--head", "none"]
    result = _run("index_throughput", argv, tmp_path / "o.json")
    assert result["backend"] == "onnxruntime" and result["cpu"] and result["config"]["smoke"] is True
    rate = result["pairs_per_second"]
    assert rate["condsearch_index"] > 0 and rate["sentence_transformers"] > 0 and result["ratio"] > 0
    assert len(result["seconds"]["condsearch_index"]) == len(result["seconds"]["sentence_transformers"]) == 1


def test_csr_states_compares_storage_types(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--router", "none"]
    states = _run("csr_states", argv, tmp_path / "o.json")["states"]
    assert list(states) == ["float32", "float16", "int8"]
    assert states["float32"]["cosine_gap_max"] < 1e-6  # float32 against itself
    sizes = [states[n]["bytes_per_sentence"] for n in states]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 0
    assert 0 <= states["int8"]["cosine_gap_median"] <= states["int8"]["cosine_gap_max"] < 1e-2


def test_finetune_smoke_records_each_run(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--runs", "lora:mse=1,wacl=0.5,full:quad", "--head-on-top"]
    argv += ["--dim", "8", "--work-dir", str(tmp_path / "runs")]
    result = _run("finetune", argv, tmp_path / "out.json")
    assert [(r["kind"], r["objectives"]) for r in result["rows"]] == [("lora", "mse=1,wacl=0.5"), ("full", "quad")]
    for row in result["rows"]:
        assert len(row["dev_spearman_per_epoch"]) == 1 and row["best_epoch"] == 1 and row["train_seconds"] >= 0
    assert (tmp_path / "runs" / "lora-mse1_wacl0.5" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "runs" / "full-quad" / "config.json").is_file()


def test_finetune_subset_keeps_both_conditions_of_a_pair(smoke_csv: Path, tmp_path: Path) -> None:
    from condsearch.corpus.csts import read_csts

    sub = read_csts(load_script("finetune").subset_csv(smoke_csv, 5, tmp_path / "sub.csv"))
    pairs = list(zip(sub.sentence1, sub.sentence2, strict=True))
    assert len(set(pairs)) == 5 and all(pairs.count(p) == 2 for p in pairs)


@pytest.mark.parametrize("arch", [None, "qwen3-0.6b"])
def test_encode_throughput_smoke(arch: str | None, tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke"] + (["--arch", arch] if arch else ["--model", str(tiny_bert_dir)])
    result = _run("encode_throughput", argv, tmp_path / "out.json")
    assert result["pairs_per_s"] > 0 and result["tokens_per_s"] > result["pairs_per_s"]
    assert 0 < result["fraction_of_bound"] and result["bound_tokens_per_s"] > 0
    assert result["model"] == (arch or str(tiny_bert_dir))


def test_batch_order_smoke_pads_less_by_tokens(tiny_bert_dir: Path, tmp_path: Path) -> None:
    result = _run("batch_order", ["--smoke", "--model", str(tiny_bert_dir)], tmp_path / "o.json")
    arms = result["arms"]
    assert set(arms) == {"characters", "tokens"} and all(a["pairs_per_s"] > 0 for a in arms.values())
    assert 1.0 <= arms["tokens"]["padded_per_real_token"] <= arms["characters"]["padded_per_real_token"]


def test_encode_throughput_int8_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    result = _run(
        "encode_throughput", ["--smoke", "--model", str(tiny_bert_dir), "--quantize", "int8"], tmp_path / "o.json"
    )
    assert set(result["pairs_per_s"]) == {
        "int8",
        "float32",
        "onnxruntime_float32",
        "torch_bfloat16",
        "sentence_transformers",
        "sentence_transformers_bfloat16",
    }
    assert result["int8_speedup"] > 0 and result["case_cosine_int8_float32"]["median"] > 0.9
    assert result["int8_vs_onnxruntime_float32"] > 0 and "torch" in result["int8_speedup_reference"]
    assert set(result["share_of_peak"]) == set(result["pairs_per_s"]) and set(result["matmul_gops"]) == {
        "torch_float32",
        "torch_bfloat16",
        "torch_int8",
        "onnxruntime_float32",
        "onnxruntime_int8",
    }
    assert all(0 < share for share in result["share_of_peak"].values())
    one = _run(
        "encode_throughput",
        ["--smoke", "--model", str(tiny_bert_dir), "--quantize", "int8", "--one-condition"],
        tmp_path / "one.json",
    )
    assert one["distinct_conditions"] == 1 < result["distinct_conditions"]


def test_csts_int8_smoke_scores_float32_beside(tiny_bert_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    argv = ["--smoke", "--mode", "case", "--model", str(tiny_bert_dir), "--quantize", "int8", "--head", "none"]
    result = _run("csts", argv, tmp_path / "out.json")
    assert result["config"]["quantize"] == "int8" and result["config"]["encoder"]["quantize"] == "int8"
    assert set(result["float32"]["dev"]) == {"spearman", "pearson", "n"}
    assert "quantize" not in result["float32"]["encoder"]
    assert result["int8_minus_float32_dev_spearman"] == pytest.approx(
        result["dev"]["spearman"] - result["float32"]["dev"]["spearman"], abs=0.01
    )


def test_serve_smoke_drives_the_real_server(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--head", "none", "--md-out", str(tmp_path / "serve.md")]
    result = _run("serve", argv, tmp_path / "serve.json")
    levels = result["server"]["levels"]
    assert [row["clients"] for row in levels] == [1, 4]
    assert all(row["errors"] == 0 and row["requests"] == 16 for row in levels)
    assert result["served_p50_ms_1_client"] > 0 and result["served_queries_per_s_max_clients"] > 0
    assert result["cli"]["median_s"] > 0 and len(result["cli"]["runs_s"]) == 1
    assert result["index"]["n"] == 2000 and "| clients |" in (tmp_path / "serve.md").read_text()


def test_serve_smoke_on_an_approximate_index_reports_its_recall(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--head", "none", "--filler", "fitted"]
    argv += ["--factory", "IVF16,Flat", "--search-params", "nprobe=16", "--stage-backends", "none"]
    result = _run("serve", argv, tmp_path / "serve.json")
    index = result["index"]
    assert index["factory"] == "IVF16,Flat" and index["search_params"] == "nprobe=16" and index["filler"] == "fitted"
    assert index["recall_at_k"] == pytest.approx(1.0) == index["recall_at_k_drawn_queries"]  # every list probed
    assert index["index_bytes"] > 2000 * 32 * 4 and result["stages"] == []
    assert all(row["errors"] == 0 for row in result["server"]["levels"])


def test_fitted_filler_has_the_real_rows_mean_and_unit_length() -> None:
    serve = load_script("serve")
    rng = np.random.default_rng(3)
    real = rng.standard_normal((64, 8)).astype(np.float32) * np.linspace(3, 0.1, 8, dtype=np.float32) + 2.0
    drawn = serve.fitted_vectors(real, 20_000, chunk=7_000)
    assert drawn.shape == (20_000, 8) and drawn.dtype == np.float32
    assert np.allclose(np.linalg.norm(drawn, axis=1), 1.0, atol=1e-5)
    unit_mean = (real / np.linalg.norm(real, axis=1, keepdims=True)).mean(axis=0)
    assert np.corrcoef(drawn.mean(axis=0), unit_mean)[0, 1] > 0.95  # the same direction of spread


def test_recall_at_k_of_a_flat_index_is_one_and_of_a_wrong_one_is_not() -> None:
    import faiss

    serve = load_script("serve")
    vectors = serve.random_unit_vectors(500, 16, seed=1)
    queries = serve.random_unit_vectors(20, 16, seed=2)
    flat = faiss.IndexFlatIP(16)
    flat.add(vectors)
    assert serve.recall_at_k(flat, vectors, queries, 10) == pytest.approx(1.0)
    shuffled = faiss.IndexFlatIP(16)
    shuffled.add(vectors[::-1].copy())  # same vectors, other ids: the ids found are wrong
    assert serve.recall_at_k(shuffled, vectors, queries, 10) < 0.5


def test_index_throughput_incremental_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.tsv"
    texts.write_text("".join(f"{i}\tsentence number {i} about a girl in a red dress\n" for i in range(260)))
    argv = ["--incremental", "--smoke", "--texts", str(texts), "--model", str(tiny_bert_dir), "--head", "none"]
    result = _run("index_throughput", [*argv, "--save-vectors", str(tmp_path / "v")], tmp_path / "o.json")
    assert result["rows_encoded_per_step"] == [2] and result["same_rows"] is True  # 1% of 200: 1 edited, 1 added
    assert result["top10_identical_queries"] == result["queries"] and result["peak_rss_mib"] > 0
    ann = ["--smoke", "--vectors", "case", "--case-vectors", str(tmp_path / "v" / "case_vectors.npy")]
    ann += ["--case-queries", str(tmp_path / "v" / "case_queries.npy"), "--rows", "150", "--kinds", "flat,hnsw"]
    real = _run("ann", ann, tmp_path / "ann.json")
    assert {r["factory"] for r in real["results"]} == {"Flat", "HNSW32"} and real["dim"] == 32


def test_rankings_agree_up_to_ties_at_the_cut() -> None:
    # a random tiny BERT gives many equal scores: which of the tied rows make the top k is the CPU's choice
    agree = load_script("common").rankings_agree
    scores = np.array([[0.9, 0.8, 0.5, 0.5], [0.9, 0.7, 0.7, 0.6]], dtype=np.float32)
    ids = np.array([[1, 2, 3, 4], [1, 2, 3, 4]])
    other_tie = np.array([[1, 2, 3, 7], [1, 3, 2, 4]])  # row 0: another row tied at the cut; row 1: a swap in a tie
    assert agree(scores, ids, scores, other_tie).tolist() == [True, True]
    assert agree(scores, ids, scores + np.float32(5e-7), other_tie).tolist() == [True, True]
    wrong_row = np.array([[1, 7, 3, 4], [1, 2, 9, 4]])  # a row replaced above the cut, in or out of a tie
    assert agree(scores, ids, scores, wrong_row).tolist() == [False, False]
    moved = scores.copy()
    moved[0, 1] = 0.79  # a score that differs beyond the tolerance
    assert agree(scores, ids, moved, ids).tolist() == [False, True]
    # the tie extends past the cut on one side only: still a tie at the k-th score
    cut = np.array([[0.9, 0.5, 0.5]], dtype=np.float32)
    assert agree(cut, np.array([[1, 2, 3]]), cut, np.array([[1, 3, 8]])).tolist() == [True]
    assert agree(cut, np.array([[1, 2, 3]]), cut, np.array([[8, 2, 3]])).tolist() == [False]
    # a row tol above the k-th score on one side and within it on the other, the same rows in the same order
    edge_a = np.array([[0.9, 0.5000102, 0.5]], dtype=np.float32)
    edge_b = np.array([[0.9, 0.5000098, 0.5]], dtype=np.float32)
    assert agree(edge_a, np.array([[1, 2, 3]]), edge_b, np.array([[1, 2, 3]]), tol=1e-5).tolist() == [True]


def test_index_throughput_stream_smoke(tmp_path: Path) -> None:
    argv = ["--stream-rows", "1", "--smoke", "--encoder", "hash", "--dim", "16"]
    result = _run("index_throughput", argv, tmp_path / "o.json")
    assert result["rows"] == 5000 and result["peak_rss_mib"] >= result["rss_before_indexing_mib"] > 0
    assert result["index_mib"] == pytest.approx(5000 * 16 * 4 / 2**20, rel=0.05)


def test_ann_smoke(tmp_path: Path) -> None:
    plotting = importlib.util.find_spec("matplotlib") is not None
    argv = ["--smoke"] + (["--plot", str(tmp_path / "ann.png")] if plotting else [])
    result = _run("ann", argv, tmp_path / "o.json")
    by = {(r["factory"], r["search_params"]): r for r in result["results"]}
    assert by[("Flat", "")]["recall_at_10"] == 1.0 and result["complete"] is True
    assert {f for f, _ in by} == {"Flat", "HNSW32", "IVF16,Flat", "IVF16,PQ4x4"}
    # more probes never find less, and probing every list is exact
    ivf = [by[("IVF16,Flat", f"nprobe={p}")]["recall_at_10"] for p in (1, 4, 16)]
    assert ivf == sorted(ivf) and ivf[-1] == 1.0
    assert (tmp_path / "ann.png").is_file() or not plotting


def test_ood_smoke_scores_every_system_and_blends_from_the_cache(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--cache-dir", str(tmp_path / "cache")]
    result = _run("ood", argv, tmp_path / "out.json")
    assert list(result["results"]) == ["plain", "prefix", "case:none", "blend:0.5:case:none"]
    for per in result["results"].values():
        assert set(per) == {"the kind of animal", "the kind of vehicle"}
        for row in per.values():
            assert 0 <= row["sibling_p10"] <= 1 and 0 <= row["in_category"] <= 1 and row["top1"] >= row["top10"]
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1 + 2 + 2  # plain once, prefix and case per condition
    again = _run("ood", argv, tmp_path / "again.json")  # every vector from the cache: the same figures
    assert again["results"] == result["results"]


def test_ood_siblings_and_members_follow_the_hypernym_edges() -> None:
    ood = load_script("ood")
    tax, conditions = ood.synthetic_taxonomy()
    assert tax.siblings("sparrow") == {"robin", "finch"}
    assert tax.descendants(["animal"]) == {"bird", "fish", "sparrow", "robin", "finch", "trout", "salmon", "carp"}
    scores, rows = ood.top_k(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)[:1], np.array([0]), 2)
    assert rows[0, 0] != 0 and scores[0, 0] == 0  # the query's own row is left out


def test_csts_smoke_trains_and_scores_a_context_router(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--mode", "csr", "--router", "train", "--variant", "context", "--k", "1"]
    result = _run("csts", [*argv, "--model", str(tiny_bert_dir)], tmp_path / "out.json")
    assert result["config"]["router_variant"] == "context" and "condition_sensitivity" in result["dev"]
    assert result["training"]["config"]["lr"] == pytest.approx(1e-4)  # the variant's own rate, resolved


def test_blend_smoke_spans_case_and_plain(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--profile", "none", "--betas", "1,0.5,0"]
    result = _run("blend", argv, tmp_path / "out.json")
    assert [row["beta"] for row in result["rows"]] == [1.0, 0.5, 0.0]
    assert all(-100 <= row["spearman"] <= 100 for row in result["rows"])


def test_retrieval_smoke_scores_every_system(tiny_bert_dir: Path, tmp_path: Path) -> None:
    result = _run("retrieval", ["--smoke", "--model", str(tiny_bert_dir)], tmp_path / "out.json")
    assert result["benchmark"] == "retrieval" and (result["pairs"], result["distractors"]) == (8, 10)
    assert list(result["results"]) == ["plain", "prefix", "case:none"]
    for row in result["results"].values():
        assert row["n"] == 2 * 8 and 0 < row["mrr_low"] <= 1 and 0 < row["mrr_high"] <= 1
        assert 0 <= row["share_better_under_high"] <= 1
    plain = result["results"]["plain"]  # encoded once for both conditions
    assert plain["share_better_under_high"] == 0.5 and plain["mrr_high"] == plain["mrr_low"]


def test_retrieval_ranks_split_ties_and_share_counts_ties_half() -> None:
    retrieval = load_script("retrieval")
    scores = np.array([[0.5, 0.9, 0.5, 0.1], [0.9, 0.1, 0.2, 0.3], [0.0, 0.0, 0.0, 0.0]])
    assert retrieval.partner_ranks(scores).tolist() == [2.5, 1.0, 2.5]  # partner first; a tie counts half
    assert retrieval.share_better(np.array([1.0, 2.5, 3.0, 2.0]), np.array([2.0, 2.5, 1.0, 4.0])) == 0.625


def test_retrieval_pairs_keep_two_conditions_with_different_labels() -> None:
    from condsearch.corpus.csts import CstsData

    retrieval = load_script("retrieval")
    rows = [
        ("a", "b", "colour", 2.0),
        ("b", "a", "shape", 4.0),  # the same pair, sides swapped: its high condition
        ("c", "d", "colour", 3.0),
        ("c", "d", "shape", 3.0),  # equal labels: dropped
        ("e", "f", "colour", 1.0),  # judged once: dropped
        ("g", "h", "size", 1.0),
        ("g", "h", "size", 5.0),  # one condition twice: dropped
    ]
    s1, s2, cond, labels = zip(*rows, strict=True)
    data = CstsData(list(s1), list(s2), list(cond), np.array(labels, dtype=np.float32))
    assert retrieval.find_pairs(data) == [retrieval.Pair("b", "a", "shape", "colour")]


def test_retrieval_condition_blind_embedder_scores_one_half() -> None:
    import hashlib

    retrieval = load_script("retrieval")
    common = load_script("common")

    def blind(texts, condition: str) -> np.ndarray:
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little") for t in texts]
        vectors = np.stack([np.random.default_rng(s).standard_normal(8) for s in seeds]).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    data = common.synthetic_csts(64)
    pairs = retrieval.find_pairs(data)
    sentences = list(dict.fromkeys(data.sentence1 + data.sentence2))
    chosen, pools = retrieval.sample(pairs, sentences, 10, 12, seed=0)
    for pair, pool in zip(chosen, pools, strict=True):
        assert len(pool) == 12 and not {pair.sentence1, pair.sentence2} & set(pool)
    result = retrieval.evaluate(chosen, pools, blind, conditional=True)  # encoded per condition, yet blind to it
    assert result["share_better_under_high"] == 0.5 and result["mrr_high"] == result["mrr_low"]
    assert result["n"] == 20


def test_int8_study_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    variants = "int8-shipped,int8-dyn,int8-dyn-fusable-rebatch,int8-dyn-fused-att,int8-static-qdq"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--variants", variants]
    result = _run("int8_study", argv, tmp_path / "o.json")
    rows = {row["variant"]: row for row in result["variants"]}
    assert {"torch-fp32", "ort-fp32", *variants.split(",")} <= set(rows)
    assert rows["torch-fp32"]["vs_torch_float32"] == 1 and rows["ort-fp32"]["vs_onnxruntime_float32"] == 1
    assert all(row["pairs_per_s"] > 0 and row["pooled_least"] > 0.9 for row in rows.values())
    assert rows["int8-dyn-fused-att"]["fused_operators"]["Attention"] == 2  # one per layer of the tiny BERT
    assert result["machine"]["cpu"] and "torch" in result["reference"]


def test_mix_scores_a_mixture_as_its_concatenated_vectors(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """mix.py's weighted cosine sum is the blend's concatenation: the same figures as ood.py and blend.py."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    argv = ["--smoke", "--model", str(tiny_bert_dir), *cache, "--systems", "case=case:none,plain=plain"]
    result = _run("mix", [*argv, "--mixes", "case@0.5+plain@0.5", "--grid", "0.5"], tmp_path / "mix.json")
    rows = {row["label"]: row for row in result["rows"]}
    assert list(rows) == ["1 case", "1 plain", "0.5 case + 0.5 plain"]
    systems = ["--systems", "case:none,plain,blend:0.5:case:none"]
    ood = _run("ood", ["--smoke", "--model", str(tiny_bert_dir), *cache, *systems], tmp_path / "ood.json")["results"]
    for label, spec in (("1 case", "case:none"), ("1 plain", "plain"), ("0.5 case + 0.5 plain", "blend:0.5:case:none")):
        for metric in ("sibling_p10", "in_category", "spread"):
            expected = np.mean([v[metric] for v in ood[spec].values()])
            assert rows[label][metric] == pytest.approx(expected, abs=0.05 if metric != "spread" else 1e-4)
    blend = _run(
        "blend",
        ["--smoke", "--model", str(tiny_bert_dir), "--profile", "none", "--betas", "1,0.5,0"],
        tmp_path / "b.json",
    )
    spearman = [row["spearman"] for row in blend["rows"]]
    assert [rows[k]["csts"] for k in ("1 case", "0.5 case + 0.5 plain", "1 plain")] == pytest.approx(spearman, abs=0.02)
    assert result["grid_points"] == 3 and result["best"] is None  # no tiny model reaches issue 25's bound
    front = [(r["csts"], r["sibling_p10"]) for r in result["pareto"]]
    assert front == sorted(front, key=lambda f: -f[0]) and all(a[1] < b[1] for a, b in itertools.pairwise(front))


def test_mix_grid_and_mixes_are_checked() -> None:
    mix = load_script("mix")
    weights = mix.grid(["a", "b", "c"], 0.5)
    assert len(weights) == 6 and all(sum(w.values()) == pytest.approx(1) for w in weights)
    assert {"a": 0.5, "c": 0.5} in weights and {"b": 1.0} in weights
    assert mix.parse_mix("a@0.25+b@0.75", ["a", "b"]) == {"a": 0.25, "b": 0.75}
    for bad in ("a@0.5+b@0.4", "z@1", "a", "a@x"):
        with pytest.raises(SystemExit):
            mix.parse_mix(bad, ["a", "b"])
    for step in (0.3, 0.0, 2.0):
        with pytest.raises(SystemExit, match="whole number of steps"):
            mix.grid(["a", "b"], step)
    rows = [
        {"csts": 66.0, "sibling_p10": 0.2},
        {"csts": 65.0, "sibling_p10": 0.19},
        {"csts": 64.0, "sibling_p10": 0.21},
    ]
    assert mix.pareto(rows) == [rows[0], rows[2]]


def test_distill_pairs_adds_rows_labelled_by_the_plain_cosine(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from condsearch.base.faiss_indexes import normalize
    from condsearch.corpus.csts import read_csts
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec

    distill = load_script("distill_pairs")
    out = tmp_path / "train.csv"
    assert distill.main(["--smoke", "--model", str(tiny_bert_dir), "--out", str(out)]) == 0
    data = read_csts(out)
    assert len(data) == 48 + 16
    extra = range(48, 64)
    assert {data.condition[i] for i in extra} <= set(distill.GENERIC_CONDITIONS)
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), profile="none"))
    for i in extra:
        a, b = normalize(encoder.encode_pairs([(data.sentence1[i], None), (data.sentence2[i], None)]))
        assert data.labels[i] == pytest.approx(min(max(1 + 4 * float(a @ b), 1), 5), abs=1e-4)


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("mix", ["--csts", "missing.csv", "--systems", "a=plain"]),
        ("distill_pairs", ["--train", "missing.csv", "--out", "out.csv"]),
        ("wise", ["--alpha", "0.5", "--router", "missing", "--out", "out"]),
    ],
)
def test_new_benchmarks_report_bad_input_in_one_line(
    script: str, argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = load_script("common")
    module = load_script(script)
    argv = [str(tmp_path / a) if a.startswith(("missing", "out")) else a for a in argv]
    assert common.exit_code(lambda: module.main(argv), f"{script}.py") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{script}.py: error: ") and "missing" in err[0]
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "out").exists()


def test_heldout_smoke_scores_label_precision_per_column(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--cache-dir", str(tmp_path / "cache")]
    result = _run("heldout", argv, tmp_path / "out.json")
    assert list(result["results"]) == ["plain", "case:none"]
    for per in result["results"].values():
        assert set(per) == {"toy/colour", "toy/animal"}
        for row in per.values():
            assert 0 <= row["chance"] <= 1 and 0 <= row["p10"] <= 1 and row["top1"] >= row["top10"]
    plain = result["results"]["plain"]
    assert plain["toy/colour"]["condition"] == "the colour"


def test_adapt_smoke_makes_the_three_way_table(tiny_bert_dir: Path, tmp_path: Path) -> None:
    result = _run("adapt", ["--smoke", "--model", str(tiny_bert_dir)], tmp_path / "out.json")
    rows = {(r["way"], r["source"]): r for r in result["rows"]}
    assert set(rows) == {("rows", "toy"), ("values", "toy"), ("conditions", "toy")}
    assert set(rows["rows", "toy"]["columns"]) == {"colour", "animal"}
    assert list(rows["conditions", "toy"]["columns"]) == ["animal"]  # trained on colour alone
    assert rows["conditions", "toy"]["trained_on"] == ["colour"]
    assert len(rows["values", "toy"]["held_values"]["colour"]) >= 1
    for row in rows.values():
        assert {"plain", "start_router", "adapted"} == set(row["mean"])


def test_probe_smoke_scores_each_column_as_adapt_does(tiny_bert_dir: Path, tmp_path: Path) -> None:
    result = _run("probe", ["--smoke", "--model", str(tiny_bert_dir)], tmp_path / "out.json")
    (row,) = result["rows"]
    assert row["source"] == "toy" and set(row["columns"]) == {"colour", "animal"}
    for column in row["columns"].values():
        assert 0 <= column["plain"] <= 1 and 0 <= column["probe"] <= 1 and 0 <= column["probe_accuracy"] <= 1
        assert column["decay"] in result["config"]["decays"] and column["fit_rows"] > column["rows"]


def test_probe_vectors_are_the_predicted_distribution_as_unit_rows() -> None:
    probe = load_script("probe")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + 2 * (x[:, 1] > 0).astype(int)  # four values, linearly separable
    w = probe.fit_probe(x, y, 4, decay=1e-4)
    vectors = probe.probe_vectors(x, w)
    assert vectors.shape == (60, 4) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.mean(vectors.argmax(axis=1) == y) > 0.9  # the probe learned the values it was fitted on


def test_word_probe_reads_terms_of_two_training_rows_and_learns_from_sparse_rows() -> None:
    probe = load_script("probe")
    texts = ["red apple pie", "red apple tart", "green pear", "green pear cake", "blue plum"]
    words = probe.WordFeatures(texts)
    assert set(words.vocabulary) == {"red", "apple", "red apple", "green", "pear", "green pear"}
    x = words(texts + ["A RED, red sky"])
    assert x.shape == (6, 6) and np.allclose(np.sqrt(x.multiply(x).sum(axis=1)).A.ravel()[:4], 1, atol=1e-6)
    assert x[4].nnz == 0 and set(x[5].indices) == {words.vocabulary["red"]}  # unknown words are dropped
    y = np.array([0, 0, 1, 1])
    w = probe.fit_probe(x[:4], y, 2, decay=1e-4)
    assert (probe.probe_vectors(x[:4], w).argmax(axis=1) == y).all()


def test_heldout_precision_counts_same_valued_neighbours_and_leaves_the_query_out() -> None:
    heldout = load_script("heldout")
    values = ["a", "a", "b", "b", "a"] + ["c"] * 10
    # query 0's top 10 (its own row left out): rows 1 and 4 share its value, the other 8 do not
    hits = np.array([[1, 4, 2, 3, 5, 6, 7, 8, 9, 10]])
    scores = np.linspace(1, 0, 10, dtype=np.float32)[None]
    row = heldout.column_metrics(values, scores, hits, [0])
    assert row["p10"] == pytest.approx(0.2) and row["chance"] == pytest.approx(2 / 14)
    assert heldout.split_of("some text") == heldout.split_of("some text") in heldout.SPLITS


def test_kgc_projection_probe_reports_norms_and_stops(tiny_bert_dir: Path, tmp_path: Path) -> None:
    argv = ["--smoke", "--train", "--model", str(tiny_bert_dir), "--projection-probe", "2"]
    result = _run("kgc", argv, tmp_path / "out.json")
    probe = result["projection_probe"]
    assert probe["steps"] == 2 and probe["norms"]["update"] > 0 and "mrr" not in result
    kgc = load_script("kgc")
    for bad in (["--projection-probe", "2"], ["--profile-steps", "2"], ["--train", "--projection-probe", "-1"]):
        with pytest.raises(SystemExit):  # a measurement of training, without --train, would score instead
            kgc.parse_args(["--smoke", *bad])
    assert set(probe["norms"]) == {
        "update",
        "token_table_update",
        "token_table",
        "rank_cut",
        "rounding",
        "other",
        "lost",
    }
