"""Ray Data encoding (--ray): the same vectors and results as the local path, on a local 2-CPU instance.

Starting Ray costs 15-20 s here, so these run under the ``ray`` mark (``make test-ray``, a step of
.ci/run), and skip with one line where the ``ray`` extra is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.errors import CondsearchError
from condsearch.scale.config import RayConfig
from condsearch.scale.ray_encode import _connect
from condsearch.store.folder import IndexStore
from tests.conftest import assert_same_ranking

WORDS = "girl dress red blue tennis court dog beach man park golf ball".split()


def _corpus(path: Path, n: int = 150) -> Path:
    texts = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 2 + i % 6)) + f" {i}" for i in range(n)]
    texts[7] = "   "  # skipped on both paths
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "text": texts}), path)
    return path


def _index(corpus: Path, where: Path, tiny_bert_dir: Path, mode: str, *flags: str) -> list[dict]:
    extra = ["--mode", "csr", "--router", "none"] if mode == "csr" else ["--head", "none"]
    args = ["index", str(corpus), "-c", "colour", "-c", "the sport", "--model", str(tiny_bert_dir), "--name", "c"]
    result = CliRunner().invoke(main, [*args, *extra, "--json", "--index-dir", str(where), *flags])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_bad_address_is_one_line_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["index", str(tmp_path / "x.parquet"), "-c", "c", "--ray", "nowhere"])
    assert result.exit_code == 2 and "Invalid value for '--ray'" in result.output


class _FakeRay:
    """ray's init/shutdown as seen by the driver: the first ``failures`` inits raise ``error``."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error, self.failures, self.inits, self.shutdowns = error, failures, 0, 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: object) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise self.error

    def shutdown(self) -> None:
        self.shutdowns += 1


TIMED_OUT = Exception("The current node timed out during startup. This could happen because ...")


def test_local_start_up_timeout_is_tried_again() -> None:
    ray = _FakeRay(TIMED_OUT, failures=2)
    assert _connect(ray, RayConfig()) is True
    assert (ray.inits, ray.shutdowns) == (3, 2)


@pytest.mark.parametrize(
    ("error", "failures", "inits"),
    [(TIMED_OUT, 3, 3), (Exception("Head node temp_dir not found in NodeInfo"), 1, 1), (RuntimeError("no GCS"), 1, 1)],
)
def test_start_up_failure_is_one_line_error(error: Exception, failures: int, inits: int) -> None:
    ray = _FakeRay(error, failures)
    with pytest.raises(CondsearchError, match=r"^--ray local: cannot start or connect \(") as info:
        _connect(ray, RayConfig())
    assert "\n" not in str(info.value) and ray.inits == inits  # only the start-up timeout is tried again
    assert ray.shutdowns == inits  # after each failed try, and what the last one left


def test_remote_address_is_not_tried_again() -> None:
    ray = _FakeRay(TIMED_OUT, failures=1)
    with pytest.raises(CondsearchError, match="--ray ray://head:10001: cannot start or connect"):
        _connect(ray, RayConfig(address="ray://head:10001"))
    assert ray.inits == 1


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["case", "csr"])
def test_ray_vectors_equal_local(tiny_bert_dir: Path, tmp_path: Path, mode: str, ray_local: None) -> None:
    corpus = _corpus(tmp_path / "c.parquet")
    # Ray's actors run the router on torch; the local auto path on onnxruntime, whose agreement with torch (float32
    # rounding, int8 states rounding either way) is test_csr_onnx's: compare like with like here
    local = _index(corpus, tmp_path / "local", tiny_bert_dir, mode, *(["--backend", "torch"] if mode == "csr" else []))
    remote = _index(corpus, tmp_path / "ray", tiny_bert_dir, mode, "--ray", "--ray-actors", "2")
    assert [r["index"] for r in local] == [r["index"] for r in remote]
    a, b = IndexStore(tmp_path / "local"), IndexStore(tmp_path / "ray")
    for row in local:
        name = row["index"]
        la, lb = a.load(name), b.load(name)
        assert la.ids == lb.ids and la.texts == lb.texts and len(la.ids) == 149
        assert la.manifest.fingerprint == lb.manifest.fingerprint and la.manifest.encoder == lb.manifest.encoder
        ba, bb = la.manifest.score_background, lb.manifest.score_background  # Ray's publish records it too
        assert ba["pairs"] == bb["pairs"] == 149 * 148 // 2 and abs(ba["mean"] - bb["mean"]) < 1e-4
        va, vb = np.load(a.root / name / "vectors.npy"), np.load(b.root / name / "vectors.npy")
        assert np.abs(va - vb).max() < 1e-5  # other batch compositions: padding differs, not values
        assert_same_ranking(la.index.search(va[:20], 10), lb.index.search(va[:20], 10))
    # the kept vectors serve a later local re-index: nothing is encoded again
    again = _index(corpus, tmp_path / "ray", tiny_bert_dir, mode)
    assert all(r["encoded"] == 0 for r in again)


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory: pytest.TempPathFactory) -> object:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'condsearch[ray]')")
    env = {"CONDSEARCH_CACHE_DIR": str(tmp_path_factory.mktemp("ray-cache")), "HF_HUB_OFFLINE": "1"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield None
    ray.shutdown()
