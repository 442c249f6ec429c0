"""A re-index of a few changed rows without torch (issue 61, item 2): the index's own model on its float32 export.

Where the CPU kind's bulk path is the checked float32 export (``avx512_fp16``, ``other``), ``condsearch index``
of a corpus whose index exists under the condition loads that index's model as a one-shot query does, so
a re-index costs what it changes, not the import of torch and transformers. Anything else loads torch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from condsearch.base.cpu_kind import CPU_KIND_ENV
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.loader import load_model_for
from condsearch.model.policy import load_light_reindex
from condsearch.store.folder import IndexStore
from condsearch.store.vectors import VECTORS_FILE
from tests.conftest import SENTENCES
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


def test_a_reindex_of_a_few_changed_rows_loads_no_torch_and_equals_a_rebuild(
    tmp_path: Path, tiny_bert_dir: Path, router: Path
) -> None:
    before = _corpus(tmp_path / "v1.parquet", list(SENTENCES))
    run(*_args(before, tiny_bert_dir, router, tmp_path / "idx"))
    changed = [*SENTENCES[:-1], "A man in a grey coat plays chess in the park."]
    after = _corpus(tmp_path / "v2.parquet", changed)
    argv = _args(after, tiny_bert_dir, router, tmp_path / "idx")
    code = (
        f"import os\nos.environ[{CPU_KIND_ENV!r}] = 'avx512_fp16'\nfrom condsearch.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code, exc.code"
    )
    modules = _modules_after(code)  # the environment's cache dir: the export and code the first build left
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
