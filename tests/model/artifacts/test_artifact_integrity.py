"""A damaged, swapped or foreign cached or shipped artifact is a cache miss or a one-line error, never a
wrong answer (issue 37, items 1 and 3): the ONNX export cache, the CSR query and sentence caches, the
vectors an incremental re-index keeps, and router folders (the shipped ones and kgc.py's two towers)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from condsearch.base.artifact_files import DEFAULT_ROUTER_DIR, ROUTER_CONFIG, ROUTER_WEIGHTS
from condsearch.base.model_sources import resolve_model
from condsearch.base.output_cache import EmbeddingCache, default_cache_dir
from condsearch.cli import main
from condsearch.errors import ModelError
from condsearch.model.csr import load_csr_encoder
from condsearch.model.csr.cache import StateCache, split
from condsearch.model.csr.context import ContextConfig
from condsearch.model.csr.weights import save_router
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.onnx.bert import (
    EXPORT_FILES,
    MODEL_FILE,
    WEIGHTS_FILE,
    export_folder,
    load_cached_export,
    read_export,
    write_export,
)
from condsearch.model.encoders.onnx.cache import CACHE_SUBDIR, META_FILE, TOKENIZER_FILE
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES
from tests.model.encoders.test_onnx_trace import _adapter

COLOUR = "color of the dress"
REPO = Path(__file__).resolve().parents[3]
SHIPPED_ROUTERS = [
    DEFAULT_ROUTER_DIR,
    REPO / "benchmarks/weights/wn18rr-minilm-router",
    REPO / "benchmarks/weights/wn18rr-minilm-context",
    REPO / "benchmarks/weights/wn18rr-minilm-context/tail",
]


# -- the ONNX export cache -----------------------------------------------------------------------


def _export(model: Path, adapter: Path | None = None) -> Path:
    """Write and check the float32 export of model (adapter merged) into its cache folder; return the folder."""
    source = resolve_model(str(model))
    reference = load_encoder(EncoderSpec(str(model), adapter=adapter, runtime=Runtime(device="cpu")))
    folder = export_folder(source, adapter, "float32")
    assert folder is not None
    written, refused = write_export(reference, source, folder, "float32", max_length=None, threads=1)
    assert refused is None and written is not None
    return folder


def _load(model: Path, adapter: Path | None = None):
    return load_cached_export(resolve_model(str(model)), "float32", max_length=None, adapter=adapter, threads=1)


def _zero_middle(path: Path, fraction: float = 0.25) -> None:
    """Overwrite the middle of a file with zeros in place (its size, inode and mtime kept)."""
    before = path.stat()
    size = before.st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 2 - int(size * fraction) // 2)
        fh.write(bytes(int(size * fraction)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as if untouched, by its dates


def test_the_export_records_each_files_size_and_sha256(tiny_bert_dir: Path) -> None:
    folder = _export(tiny_bert_dir)
    files = json.loads((folder / META_FILE).read_text())["files"]
    assert set(files) == set(EXPORT_FILES)
    for name, record in files.items():
        data = (folder / name).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_zeros_in_the_middle_of_the_exports_weights_are_not_used(tiny_bert_dir: Path) -> None:
    folder = _export(tiny_bert_dir)
    assert _load(tiny_bert_dir) is not None
    _zero_middle(folder / WEIGHTS_FILE)
    assert _load(tiny_bert_dir) is None  # a cache miss, not zeros for scores
    source = resolve_model(str(tiny_bert_dir))
    assert read_export(folder, source, max_length=None, threads=1) is None  # so that it is exported again


def test_a_truncated_or_missing_export_file_is_not_used(tiny_bert_dir: Path) -> None:
    folder = _export(tiny_bert_dir)
    with open(folder / TOKENIZER_FILE, "r+b") as fh:
        fh.truncate(100)
    assert _load(tiny_bert_dir) is None
    folder = _export(tiny_bert_dir)  # written again over the damaged one
    assert _load(tiny_bert_dir) is not None
    (folder / MODEL_FILE).unlink()
    assert _load(tiny_bert_dir) is None


def test_another_profiles_export_copied_in_is_not_used(tiny_bert_dir: Path, tmp_path: Path) -> None:
    adapter = _adapter(tiny_bert_dir, tmp_path / "adapter")
    plain, tuned = _export(tiny_bert_dir), _export(tiny_bert_dir, adapter)
    assert plain != tuned
    for name in EXPORT_FILES:  # the model's files only: export.json still records the plain export's
        shutil.copy(tuned / name, plain / name)
    assert _load(tiny_bert_dir) is None
    plain = _export(tiny_bert_dir)  # written again; now all of it copied in: its record names another cache folder
    for name in (*EXPORT_FILES, META_FILE):
        shutil.copy(tuned / name, plain / name)
    assert _load(tiny_bert_dir) is None
    assert _load(tiny_bert_dir, adapter) is not None  # the source of the copy is untouched


def test_a_verified_export_is_hashed_again_only_when_its_files_change(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.model.encoders.onnx.cache as onnx_cache

    folder = _export(tiny_bert_dir)
    hashed: list[str] = []
    digest = onnx_cache._sha256
    monkeypatch.setattr(onnx_cache, "_sha256", lambda path: hashed.append(Path(path).name) or digest(path))
    # the files were written just now: a change within the same timestamp tick could go unseen, so no stamp yet
    assert _load(tiny_bert_dir) is not None and sorted(hashed) == sorted(EXPORT_FILES)
    hashed.clear()
    assert _load(tiny_bert_dir) is not None and sorted(hashed) == sorted(EXPORT_FILES)
    later = onnx_cache.time.time_ns() + 60 * 10**9  # a minute on: the files have settled
    monkeypatch.setattr(onnx_cache.time, "time_ns", lambda: later)
    hashed.clear()
    assert _load(tiny_bert_dir) is not None and sorted(hashed) == sorted(EXPORT_FILES)  # verified, and stamped
    hashed.clear()
    assert _load(tiny_bert_dir) is not None and hashed == []  # the stamp stands for the hash
    _zero_middle(folder / WEIGHTS_FILE)  # size and mtime kept; the change time moves, which no one can set back
    assert _load(tiny_bert_dir) is None and WEIGHTS_FILE in hashed


def _index(corpus: Path, index_dir: Path, model: Path, *extra: str) -> tuple[dict, str]:
    argv = ["index", str(corpus), "-c", COLOUR, "--model", str(model), "--head", "none", "--device", "cpu"]
    result = CliRunner().invoke(main, [*argv, "--json", "--index-dir", str(index_dir), *extra])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    [row] = [json.loads(line) for line in result.stdout.splitlines()]
    return row, result.stderr


def _exports() -> list[Path]:
    root = default_cache_dir() / CACHE_SUBDIR
    return [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []


def _vectors(index_dir: Path) -> np.ndarray:
    store = IndexStore(index_dir)
    loaded = store.load(store.find(COLOUR))
    return loaded.index.reconstruct_n(0, loaded.index.ntotal)


def test_a_damaged_export_is_exported_again_and_queries_answer_as_torch(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index_dir = str(tmp_path / "ix")
    _index(corpus_file, Path(index_dir), tiny_bert_dir, "--backend", "torch")
    argv = ["query", SENTENCES[2], "-c", COLOUR, "-k", "3", "--json", "--index-dir", index_dir]
    first = CliRunner().invoke(main, argv)  # through torch; writes the export
    assert first.exit_code == 0, first.output
    (folder,) = _exports()
    assert CliRunner().invoke(main, argv).stdout  # the export answers now
    _zero_middle(folder / WEIGHTS_FILE)
    with caplog.at_level(logging.WARNING):
        damaged = CliRunner().invoke(main, argv)
    assert damaged.exit_code == 0, damaged.output
    notices = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(notices) == 1 and str(folder) in notices[0] and WEIGHTS_FILE in notices[0], notices
    assert "\n" not in notices[0]
    want = [[h["id"] for h in json.loads(line)["results"]] for line in first.stdout.splitlines()]
    got = [[h["id"] for h in json.loads(line)["results"]] for line in damaged.stdout.splitlines()]
    assert got == want
    for a, b in zip(damaged.stdout.splitlines(), first.stdout.splitlines(), strict=True):
        np.testing.assert_allclose(
            [h["score"] for h in json.loads(a)["results"]], [h["score"] for h in json.loads(b)["results"]], atol=1e-5
        )
    assert _load(tiny_bert_dir) is not None  # exported again, checked, and usable


def test_an_index_built_while_the_export_is_damaged_holds_torchs_vectors(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    _index(corpus_file, tmp_path / "first", tiny_bert_dir)  # auto: writes the export, encodes on onnxruntime
    (folder,) = _exports()
    _zero_middle(folder / WEIGHTS_FILE)
    row, _ = _index(corpus_file, tmp_path / "ix", tiny_bert_dir)
    assert row["encoded"] == len(SENTENCES)
    _index(corpus_file, tmp_path / "torch", tiny_bert_dir, "--backend", "torch")
    np.testing.assert_allclose(_vectors(tmp_path / "ix"), _vectors(tmp_path / "torch"), atol=1e-4, rtol=0)


def test_vectors_kept_from_before_exports_were_checked_are_encoded_again(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    """An index built before exports were checked may hold a damaged export's vectors: none is kept."""
    index_dir = tmp_path / "ix"
    _index(corpus_file, index_dir, tiny_bert_dir)
    store = IndexStore(index_dir)
    name = store.find(COLOUR)
    manifest_path = store.root / name / "manifest.json"
    manifest_path = manifest_path.resolve()
    raw = json.loads(manifest_path.read_text())
    payload = {"encoder": raw["encoder"], "mode": raw["mode"], "head_checksum": raw["head_checksum"], "dim": raw["dim"]}
    old = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    assert old != raw["fingerprint"]  # the fingerprint as 5a61de4 computed it is not this version's
    manifest_path.write_text(json.dumps({**raw, "fingerprint": old}))
    row, _ = _index(corpus_file, index_dir, tiny_bert_dir)
    assert (row["encoded"], row["reused"]) == (len(SENTENCES), 0)


def test_index_says_how_many_pairs_it_encoded_and_kept(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    n = len(SENTENCES)
    _, stderr = _index(corpus_file, tmp_path / "ix", tiny_bert_dir, "--backend", "torch")
    assert "encoded on torch" in stderr.splitlines()[-1] and "kept" not in stderr.splitlines()[-1]
    row, stderr = _index(corpus_file, tmp_path / "ix", tiny_bert_dir, "--backend", "torch")
    assert (row["encoded"], row["reused"]) == (0, n)
    closing = stderr.splitlines()[-1]
    # nothing encoded: no rate of nothing (issue 59: a second `make demo` said "63 pairs/s")
    assert closing.startswith(f"condsearch: nothing to encode: all {n} rows already indexed") and "/s" not in closing


# -- the CSR caches --------------------------------------------------------------------------------


def _negate_npz(directory: Path) -> int:
    """Negate the vectors of every shard in directory, keeping every other array as it is; return how many."""
    shards = sorted(directory.glob("shard-*.npz"))
    for shard in shards:
        with np.load(shard, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        arrays["vectors"] = -arrays["vectors"]
        with open(shard, "wb") as fh:
            np.savez(fh, **arrays)
    return len(shards)


def _negate_states(directory: Path) -> int:
    """Negate the float tensors of every state shard under directory, keeping the rest; return how many."""
    shards = sorted(directory.rglob("shard-*.safetensors"))
    for shard in shards:
        tensors = load_file(str(shard))
        flipped = {k: (-v if v.is_floating_point() or v.dtype == torch.int8 else v) for k, v in tensors.items()}
        flipped = {k: (v.abs() if k.endswith(".scale") else v) for k, v in flipped.items()}
        save_file(flipped, str(shard))
    return len(shards)


def test_a_negated_query_cache_shard_is_a_miss(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path / "q")
    vectors = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    cache.put_many(["a" * 64, "b" * 64, "c" * 64], vectors)
    assert len(EmbeddingCache(tmp_path / "q").get_many(["a" * 64])) == 1
    assert _negate_npz(tmp_path / "q") == 1
    assert EmbeddingCache(tmp_path / "q").get_many(["a" * 64, "b" * 64, "c" * 64]) == {}


def test_negated_csr_query_and_sentence_caches_give_the_right_vectors(tiny_bert_dir: Path, tmp_path: Path) -> None:
    def encoder():
        return load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path, state_dtype=torch.float32)

    want = encoder().encode(SENTENCES, COLOUR)
    assert _negate_npz(tmp_path / "csr-queries") >= 1
    np.testing.assert_allclose(encoder().encode(SENTENCES, COLOUR), want, atol=1e-5)
    assert _negate_states(tmp_path / "csr-states") >= 1
    np.testing.assert_allclose(encoder().encode(SENTENCES, COLOUR), want, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_a_negated_sentence_state_is_missing(tiny_bert_dir: Path, tmp_path: Path, dtype: torch.dtype) -> None:
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "c")
    with torch.inference_mode():
        states = encoder.router.sentence_states(encoder._tokenize(SENTENCES[:3]))
    keys = ["aa" * 32, "bb" * 32, "cc" * 32]
    StateCache(tmp_path / "s", dtype=dtype).put(keys, split(states))
    assert StateCache(tmp_path / "s", dtype=dtype).missing(keys) == []
    assert _negate_states(tmp_path / "s") == 1
    assert StateCache(tmp_path / "s", dtype=dtype).missing(keys) == [0, 1, 2]


# -- router folders ----------------------------------------------------------------------------------


def _router(tiny_bert_dir: Path, tmp_path: Path, name: str, seed: int) -> Path:
    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", cache_dir=tmp_path / "cache")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.router.trainable_parameters().values():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    save_router(encoder.router, tmp_path / name, {"model_id": encoder.model_id}, dtype=torch.float32)
    return tmp_path / name


def test_a_router_records_its_weights_size_and_sha256(tiny_bert_dir: Path, tmp_path: Path) -> None:
    folder = _router(tiny_bert_dir, tmp_path, "r", seed=0)
    data = (folder / ROUTER_WEIGHTS).read_bytes()
    record = json.loads((folder / ROUTER_CONFIG).read_text())["weights"]
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_router_folder_with_another_routers_weights_is_refused(tiny_bert_dir: Path, tmp_path: Path) -> None:
    a, b = _router(tiny_bert_dir, tmp_path, "a", seed=0), _router(tiny_bert_dir, tmp_path, "b", seed=1)
    shutil.copy(b / ROUTER_WEIGHTS, a / ROUTER_WEIGHTS)  # the same shapes: only the checksum tells
    with pytest.raises(ModelError, match=r"router\.safetensors.*sha256") as exc:
        load_csr_encoder(str(tiny_bert_dir), router=str(a), cache_dir=tmp_path / "cache")
    assert "\n" not in str(exc.value)
    with open(b / ROUTER_WEIGHTS, "ab") as fh:  # a size that differs is told before any hashing
        fh.write(b"\0")
    with pytest.raises(ModelError, match="bytes"):
        load_csr_encoder(str(tiny_bert_dir), router=str(b), cache_dir=tmp_path / "cache")


def test_a_router_json_without_a_checksum_loads_with_its_shapes_checked(
    tiny_bert_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _router(tiny_bert_dir, tmp_path, "old", seed=0)
    meta = json.loads((folder / ROUTER_CONFIG).read_text())
    del meta["weights"]  # as condsearch wrote it before issue 37
    (folder / ROUTER_CONFIG).write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        load_csr_encoder(str(tiny_bert_dir), router=str(folder), cache_dir=tmp_path / "cache")
    assert any("records no sha256" in r.getMessage() for r in caplog.records)


def _context_router(tiny_bert_dir: Path, tmp_path: Path, name: str, **kwargs: object) -> Path:
    from condsearch.model.csr.context_weights import backbone_delta, base_weights, save_context_router

    encoder = load_csr_encoder(
        str(tiny_bert_dir), router="none", variant=ContextConfig(k=1), cache_dir=tmp_path / "cache"
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in encoder.router.model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=generator))
    base = base_weights(str(tiny_bert_dir))
    delta, rank = backbone_delta(base, encoder.router.model, **kwargs)  # type: ignore[arg-type]
    save_context_router(encoder.router, delta, rank, tmp_path / name, {"model_id": encoder.model_id})  # type: ignore[arg-type]
    return tmp_path / name


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("rank", 3, "rank"), ("tensors", 1, "tensors"), ("bytes", 12, "bytes"), ("encoding", "whole", "encoding")],
)
def test_a_context_routers_recorded_shape_fields_are_checked(
    tiny_bert_dir: Path, tmp_path: Path, field: str, value: object, message: str
) -> None:
    folder = _context_router(tiny_bert_dir, tmp_path, "ctx", max_bytes=0, rank=4)  # compact, at rank 4
    meta = json.loads((folder / ROUTER_CONFIG).read_text())
    assert meta["backbone_delta"]["rank"] == 4
    load_csr_encoder(str(tiny_bert_dir), router=str(folder), cache_dir=tmp_path / "cache")  # as saved: loads
    meta["backbone_delta"][field] = value
    (folder / ROUTER_CONFIG).write_text(json.dumps(meta))
    with pytest.raises(ModelError, match=message) as exc:
        load_csr_encoder(str(tiny_bert_dir), router=str(folder), cache_dir=tmp_path / "cache")
    assert "\n" not in str(exc.value)


def test_an_unrecorded_context_router_of_another_rank_is_refused(tiny_bert_dir: Path, tmp_path: Path) -> None:
    a = _context_router(tiny_bert_dir, tmp_path, "a", max_bytes=0, rank=4)
    b = _context_router(tiny_bert_dir, tmp_path, "b", max_bytes=0, rank=2)
    meta = json.loads((a / ROUTER_CONFIG).read_text())
    del meta["weights"]
    (a / ROUTER_CONFIG).write_text(json.dumps(meta))
    shutil.copy(b / ROUTER_WEIGHTS, a / ROUTER_WEIGHTS)
    with pytest.raises(ModelError, match="rank"):
        load_csr_encoder(str(tiny_bert_dir), router=str(a), cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("folder", SHIPPED_ROUTERS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_router_records_and_matches_its_checksum(folder: Path) -> None:
    from condsearch.model.artifacts.routers import checked_router_checksum

    record = json.loads((folder / ROUTER_CONFIG).read_text())["weights"]
    assert checked_router_checksum(folder) == record["sha256"]
    assert (folder / ROUTER_WEIGHTS).stat().st_size == record["size"]


def test_the_shipped_default_routers_weights_fit_its_recorded_shape() -> None:
    from condsearch.model.artifacts.router_delta import check_delta_record
    from condsearch.model.artifacts.routers import read_router_config

    state = load_file(str(DEFAULT_ROUTER_DIR / ROUTER_WEIGHTS))
    check_delta_record(read_router_config(DEFAULT_ROUTER_DIR), state, DEFAULT_ROUTER_DIR)


def test_kgc_with_the_two_towers_weights_swapped_refuses(tmp_path: Path) -> None:
    from benchmarks._lib.kgclib.encoding import load_tail_tower
    from condsearch.model.csr.context_weights import base_weights

    source = REPO / "benchmarks/weights/wn18rr-minilm-context"
    swapped = tmp_path / "wn18rr"
    shutil.copytree(source, swapped)
    shutil.copy(source / "tail" / ROUTER_WEIGHTS, swapped / ROUTER_WEIGHTS)
    shutil.copy(source / ROUTER_WEIGHTS, swapped / "tail" / ROUTER_WEIGHTS)
    with pytest.raises(ModelError, match="sha256"):
        load_csr_encoder(router=str(swapped), device="cpu", cache_dir=tmp_path / "cache")
    encoder = load_csr_encoder(router=str(source), device="cpu", cache_dir=tmp_path / "cache")
    base = base_weights(encoder.source.location)
    assert load_tail_tower(encoder.router, source, base) is not None  # the shipped towers load
    with pytest.raises(ModelError, match="sha256"):
        load_tail_tower(encoder.router, swapped, base)
    # both folders swapped whole (each router.json with its own weights): the roles tell
    whole = tmp_path / "whole"
    shutil.copytree(source, whole)
    for name in (ROUTER_CONFIG, ROUTER_WEIGHTS):
        shutil.copy(source / "tail" / name, whole / name)
        shutil.copy(source / name, whole / "tail" / name)
    with pytest.raises(ModelError, match="candidate tower"):
        load_tail_tower(encoder.router, whole, base)
