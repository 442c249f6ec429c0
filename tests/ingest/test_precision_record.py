"""Every vector of an index is in the precision its manifest records (issue 58, item 10).

``--dtype auto`` encodes in bfloat16 on an AMX or AVX-512 BF16 CPU and in float32 elsewhere, and the
vectors' fingerprint leaves that choice out. An incremental re-index on another CPU kind kept the
last index's bfloat16 vectors and recorded ``precision: float32``. Now a re-index keeps vectors only
in the precision it encodes in: across kinds it encodes every row again. The kind is forced with
``CONDSEARCH_CPU_KIND`` between two runs, as on two machines.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.base.cpu_kind import CPU_KIND_ENV
from condsearch.cli import main
from tests.conftest import SENTENCES

CONDITION = "color of the dress"
#: the CPU kind whose --dtype auto is bfloat16 (torch), and one whose is float32
BF16_KIND, FLOAT32_KIND = "avx512", "other"


def _corpus(path: Path, n: int) -> Path:
    texts = [*SENTENCES, *(f"a girl in a {c} dress number {i}" for i, c in enumerate(["red", "blue", "pink"] * 4))]
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(n)], "text": texts[:n]}), path)
    return path


def _index(monkeypatch: pytest.MonkeyPatch, kind: str, corpus: Path, folder: Path, model: Path) -> dict:
    monkeypatch.setenv(CPU_KIND_ENV, kind)
    args = ["index", str(corpus), "-c", CONDITION, "--mode", "case", "--profile", "none", "--name", "c"]
    result = CliRunner().invoke(main, [*args, "--model", str(model), "--index-dir", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[0])


def _vectors(folder: Path, report: dict) -> np.ndarray:
    return np.load(Path(folder) / report["index"] / "vectors.npy")


@pytest.mark.parametrize(("first", "second"), [(BF16_KIND, FLOAT32_KIND), (FLOAT32_KIND, BF16_KIND)])
def test_a_re_index_on_another_cpu_kind_encodes_every_row_in_its_precision(
    tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    precision = {BF16_KIND: "bfloat16", FLOAT32_KIND: "float32"}
    small, large = _corpus(tmp_path / "small.parquet", 15), _corpus(tmp_path / "large.parquet", 16)
    folder, fresh = tmp_path / "idx", tmp_path / "fresh"
    built = _index(monkeypatch, first, small, folder, tiny_bert_dir)
    assert built["precision"] == precision[first] and built["encoded"] == 15
    again = _index(monkeypatch, second, large, folder, tiny_bert_dir)
    assert again["precision"] == precision[second]
    assert (again["encoded"], again["reused"]) == (16, 0)  # none of the other precision's vectors kept
    manifest = json.loads((folder / again["index"] / "manifest.json").read_text())
    assert manifest["encoder"].get("auto_dtype", "float32") == precision[second]
    whole = _index(monkeypatch, second, large, fresh, tiny_bert_dir)  # what a full build on that kind gives
    np.testing.assert_array_equal(_vectors(folder, again), _vectors(fresh, whole))


def test_a_re_index_on_the_same_kind_still_keeps_its_vectors(
    tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large = _corpus(tmp_path / "small.parquet", 15), _corpus(tmp_path / "large.parquet", 16)
    folder = tmp_path / "idx"
    _index(monkeypatch, BF16_KIND, small, folder, tiny_bert_dir)
    again = _index(monkeypatch, BF16_KIND, large, folder, tiny_bert_dir)
    assert (again["encoded"], again["reused"], again["precision"]) == (1, 15, "bfloat16")
