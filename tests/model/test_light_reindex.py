"""A re-index of a few changed rows without torch (issue 61, item 2): the index's own model on its float32 export.

Where the CPU kind's bulk path is the checked float32 export (``avx512_fp16``, ``other``), ``condsearch index``
of a corpus whose index exists under the condition loads that index's model as a one-shot query does, so
a re-index costs what it changes, not the import of torch and transformers. Where the kind routes in torch
bfloat16 (``amx``), a router index is re-indexed on the router's plain copy: torch, without transformers.
Anything else loads torch and transformers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY, CPU_KIND_ENV
from condsearch.model.csr.bfloat16 import Bfloat16Router
from condsearch.model.csr.keys import PLAIN_FILE
from condsearch.model.csr.one_shot import OneShotRouterEncoder
from condsearch.model.csr.onnx import routed_pairs
from condsearch.model.csr.plain_copy import plain_copy_folder
from condsearch.model.encoders.onnx.export import pooled_cosines
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.loader import load_model_for
from condsearch.model.policy import load_light_reindex
from condsearch.store.folder import IndexStore
from condsearch.store.vectors import VECTORS_FILE
from tests.conftest import SENTENCES
from tests.model.csr.test_csr_bfloat16 import MIN_COSINE
from tests.model.csr.test_csr_one_shot import CONDITION, save_moved_router
from tests.model.csr.test_csr_parity import run
from tests.serve.test_serve_cli import _modules_after
from tests.tolerance import EPS32


@pytest.fixture(scope="module")
def router(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_moved_router(tiny_bert_dir, "context", tmp_path_factory.mktemp("router-context"))


def _corpus(path: Path, texts: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [f"s{i}" for i in range(len(texts))], "text": texts}), path)
    return path


def _args(corpus: Path, model: Path, router: Path, index_dir: Path) -> list[str]:
    return ["index", str(corpus), "-c", CONDITION, "--mode", "csr", "--router", str(router), "--model", str(model),
            "--index-dir", str(index_dir), "--device", "cpu", "--name", "corpus"]  # fmt: skip


def _vectors(index_dir: Path) -> np.ndarray:
    store = IndexStore(index_dir)
    (name,) = store.names()
    return np.load(store.root / name / VECTORS_FILE)


def _spec(model: Path, router: Path, **changes: object) -> EncoderSpec:
    spec = EncoderSpec(model=str(model), mode="csr", router=str(router), runtime=Runtime(device="cpu"))
    return replace(spec, **changes)  # type: ignore[arg-type]


def _manifest(index_dir: Path):
    store = IndexStore(index_dir)
    (name,) = store.names()
    return store.read_manifest(name)


def _build_then_reindex(tmp_path: Path, model: Path, router: Path, kind: str) -> tuple[Path, set[str]]:
    """Build idx from the sentences here, then re-index one changed row in a fresh process of CPU kind ``kind``;
    return the changed corpus and the modules that re-index imported (the environment's cache dir: what the
    build left there)."""
    run(*_args(_corpus(tmp_path / "v1.parquet", list(SENTENCES)), model, router, tmp_path / "idx"))
    changed = [*SENTENCES[:-1], "A man in a grey coat plays chess in the park."]
    after = _corpus(tmp_path / "v2.parquet", changed)
    argv = _args(after, model, router, tmp_path / "idx")
    code = (
        f"import os\nos.environ[{CPU_KIND_ENV!r}] = {kind!r}\nfrom condsearch.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code, exc.code"
    )
    return after, _modules_after(code)


def test_a_reindex_of_a_few_changed_rows_loads_no_torch_and_equals_a_rebuild(
    tmp_path: Path, tiny_bert_dir: Path, router: Path
) -> None:
    after, modules = _build_then_reindex(tmp_path, tiny_bert_dir, router, "avx512_fp16")
    assert "torch" not in modules and "transformers" not in modules
    run(*_args(after, tiny_bert_dir, router, tmp_path / "full"), "--full")
    assert _manifest(tmp_path / "idx").fingerprint == _manifest(tmp_path / "full").fingerprint
    np.testing.assert_allclose(_vectors(tmp_path / "idx"), _vectors(tmp_path / "full"), atol=64 * EPS32)


def test_only_the_indexs_own_model_on_its_float32_path_is_loaded_light(
    tmp_path: Path, tiny_bert_dir: Path, router: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = _corpus(tmp_path / "v1.parquet", list(SENTENCES))
    run(*_args(corpus, tiny_bert_dir, router, tmp_path / "idx"))
    manifest = _manifest(tmp_path / "idx")
    spec = _spec(tiny_bert_dir, router)
    light = load_light_reindex(spec, manifest, CONDITION)
    assert light is not None and light.backend == "onnxruntime"
    assert load_model_for("bulk", spec, reindex=(manifest, CONDITION)) is not None
    # anything the index does not record, another runner or device, or a CPU kind that encodes in bfloat16: torch
    others = (_spec(tiny_bert_dir, router, max_length=16), _spec(tiny_bert_dir, "none"), replace(spec, mode="case"))
    for other in others:
        assert load_light_reindex(other, manifest, CONDITION) is None
    assert load_light_reindex(spec, manifest, CONDITION, backend="torch") is None
    assert load_light_reindex(replace(spec, runtime=Runtime(device="cuda")), manifest, CONDITION) is None
    assert load_light_reindex(spec, manifest, "a condition never indexed") is None  # its code is not cached
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    assert load_light_reindex(spec, manifest, CONDITION) is None


def test_on_a_bfloat16_kind_a_reindex_runs_the_plain_copy_without_transformers(
    tmp_path: Path, tiny_bert_dir: Path, router: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "amx")  # the router's bulk path is torch bfloat16: the build writes the copy
    after, modules = _build_then_reindex(tmp_path, tiny_bert_dir, router, "amx")
    assert _manifest(tmp_path / "idx").encoder[AUTO_DTYPE_KEY] == "bfloat16"
    assert "torch" in modules and "transformers" not in modules
    run(*_args(after, tiny_bert_dir, router, tmp_path / "full"), "--full")
    reindexed, full = _manifest(tmp_path / "idx"), _manifest(tmp_path / "full")
    assert reindexed.fingerprint == full.fingerprint and reindexed.encoder == full.encoder
    # the same bfloat16 passes: batches of other rows round other ways, within bfloat16's bound
    cosines = pooled_cosines(_vectors(tmp_path / "idx"), _vectors(tmp_path / "full"))
    assert cosines.min() > MIN_COSINE


def test_the_plain_copy_routes_as_the_bfloat16_router_and_a_damaged_one_is_not_loaded(
    tmp_path: Path, tiny_bert_dir: Path, router: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, "amx")
    corpus = _corpus(tmp_path / "v1.parquet", list(SENTENCES))
    run(*_args(corpus, tiny_bert_dir, router, tmp_path / "idx"))
    manifest, spec = _manifest(tmp_path / "idx"), _spec(tiny_bert_dir, router)
    light = load_light_reindex(spec, manifest, CONDITION)
    assert light is not None and (light.backend, light.encoder.precision) == ("torch", "bfloat16")
    torch_path = load_model_for("bulk", spec)
    assert torch_path.encoder.precision == "bfloat16" and not isinstance(torch_path.encoder, OneShotRouterEncoder)
    np.testing.assert_allclose(
        light.encode(list(SENTENCES), CONDITION), torch_path.encode(list(SENTENCES), CONDITION), atol=1e-2
    )
    # the same modules' arithmetic on the same batches: the probe agrees within float32 rounding (bit for bit on MiniLM)
    copy = light.encoder.sessions.router  # type: ignore[attr-defined]
    reference = Bfloat16Router(torch_path.encoder.router)  # type: ignore[attr-defined]
    np.testing.assert_allclose(
        routed_pairs(copy, torch_path.encoder)[0],  # type: ignore[arg-type]
        routed_pairs(reference, torch_path.encoder)[0],  # type: ignore[arg-type]
        atol=64 * EPS32,
    )
    folder = plain_copy_folder(torch_path.encoder)  # type: ignore[arg-type]
    assert folder is not None and (folder / PLAIN_FILE).is_file()
    with (folder / PLAIN_FILE).open("r+b") as f:  # one byte changed: its sha256 no longer matches
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert load_light_reindex(spec, manifest, CONDITION) is None
    monkeypatch.setenv(CPU_KIND_ENV, "avx512_fp16")  # a kind that builds on the export: not on the copy
    assert load_light_reindex(spec, manifest, CONDITION) is None
