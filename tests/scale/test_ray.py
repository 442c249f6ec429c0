"""Ray Data encoding (--ray): the same vectors and results as the local path, on a local 2-CPU instance.

Starting Ray costs 15-20 s here, so these run under the ``ray`` mark (``make test-ray``, a step of
.ci/run), and skip with one line where the ``ray`` extra is missing. The workers take the driver's path
(issue 61, item 4): its CPU kind and backend; that they load so is checked in this process too, without Ray.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY, CPU_KIND_ENV
from condsearch.cli import main
from condsearch.errors import CondsearchError
from condsearch.model import backend_of, load_model_for
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.identity import ModelIdentity
from condsearch.scale.config import RayConfig
from condsearch.scale.ray_encode import EncodeActor, EncodePath, _connect, describe_vectorizer
from condsearch.store.folder import IndexStore
from condsearch.store.manifest import encoder_precision
from tests.conftest import assert_same_ranking
from tests.tolerance import EPS32

WORDS = "girl dress red blue tennis court dog beach man park golf ball".split()


def _corpus(path: Path, n: int = 150) -> Path:
    texts = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 2 + i % 6)) + f" {i}" for i in range(n)]
    texts[7] = "   "  # skipped on both paths
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "text": texts}), path)
    return path


#: each mode's flags; "csr-context": the router variant whose bulk path is bfloat16 on AMX and AVX-512 BF16 CPUs
MODE_FLAGS = {
    "case": ["--head", "none"],
    "csr": ["--mode", "csr", "--router", "none"],
    "csr-context": ["--mode", "csr", "--router", "none", "--router-variant", "context"],
}
#: a CPU kind whose bulk path (torch bfloat16) differs from plain torch float32, and one whose does not
BF16_KIND, OTHER_KIND = "avx512", "other"
#: bfloat16's machine epsilon (8 bits of mantissa): two batchings of one bfloat16 model agree to about its
#: rounding, closer than bfloat16 and float32 do
BF16_EPS = 2.0**-7


def _index(corpus: Path, where: Path, tiny_bert_dir: Path, mode: str, *flags: str) -> list[dict]:
    extra = MODE_FLAGS[mode]
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
    # both on the local bulk path of this kind (other: the float32 export where it is faster), Ray's actors too
    local = _index(corpus, tmp_path / "local", tiny_bert_dir, mode)
    remote = _index(corpus, tmp_path / "ray", tiny_bert_dir, mode, "--ray", "--ray-actors", "2")
    assert [r["index"] for r in local] == [r["index"] for r in remote]
    assert [(r["backend"], r["precision"]) for r in local] == [(r["backend"], r["precision"]) for r in remote]
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


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["case", "csr-context"])
def test_ray_takes_the_drivers_path_on_another_cpu_kind(
    tiny_bert_dir: Path, tmp_path: Path, mode: str, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the instance's workers started under the session's kind (other); the driver is now an AVX-512 BF16 CPU,
    # whose bulk path is torch bfloat16: the Ray-built index must be the local one (issue 61, item 4: the
    # router ran in float32 on the actors, 0.98 of the demo's top 10 shared with the local bfloat16 build)
    monkeypatch.setenv(CPU_KIND_ENV, BF16_KIND)
    corpus = _corpus(tmp_path / "c.parquet")
    local = _index(corpus, tmp_path / "local", tiny_bert_dir, mode)
    remote = _index(corpus, tmp_path / "ray", tiny_bert_dir, mode, "--ray", "--ray-actors", "2")
    assert [(r["index"], r["backend"], r["precision"]) for r in local] == [
        (r["index"], r["backend"], r["precision"]) for r in remote
    ]
    assert {r["precision"] for r in local} == {"bfloat16"}
    a, b = IndexStore(tmp_path / "local"), IndexStore(tmp_path / "ray")
    for row in local:
        la, lb = a.load(row["index"]), b.load(row["index"])
        assert la.manifest.encoder == lb.manifest.encoder and la.manifest.encoder[AUTO_DTYPE_KEY] == "bfloat16"
        assert la.manifest.precision == lb.manifest.precision == "bfloat16"
        assert la.manifest.fingerprint == lb.manifest.fingerprint and la.manifest.spec == lb.manifest.spec
        va, vb = np.load(a.root / row["index"] / "vectors.npy"), np.load(b.root / row["index"] / "vectors.npy")
        # unit vectors rounded to bfloat16 on the way: other batchings may move an entry by about an ulp at the
        # vector's scale (none did here), far less than bfloat16 is from float32 (0.0085 for this CASE model)
        gap = np.abs(va.astype(np.float64) - vb.astype(np.float64)).max()
        assert gap <= 2 * BF16_EPS / np.sqrt(va.shape[1]), gap
        assert_same_ranking(la.index.search(va[:20], 10), lb.index.search(va[:20], 10), tol=2 * BF16_EPS)


@pytest.mark.parametrize(("mode", "kind"), [("csr-context", BF16_KIND), ("case", BF16_KIND), ("case", OTHER_KIND)])
def test_workers_load_the_drivers_path(
    tiny_bert_dir: Path, tmp_path: Path, mode: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # in this process, without Ray: the driver resolves its path, a worker on another CPU kind loads on it
    extra = {"router": "none", "router_variant": "context"} if mode == "csr-context" else {"head": "none"}
    spec = EncoderSpec(
        str(tiny_bert_dir), mode="csr" if mode == "csr-context" else "case", runtime=Runtime(device="cpu"), **extra
    )
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # a Ray worker's thread count: none in this process
    monkeypatch.setenv(CPU_KIND_ENV, kind)
    path = EncodePath.resolve("auto")
    local = load_model_for("bulk", spec, backend="auto")  # what `condsearch index` here loads
    worker_kind = OTHER_KIND if kind != OTHER_KIND else BF16_KIND
    monkeypatch.setenv(CPU_KIND_ENV, worker_kind)  # the worker's own CPU
    described = describe_vectorizer(spec, path)
    actor = EncodeActor(spec, ["colour"], 4, path)
    assert described.identity == ModelIdentity.of_vectorizer(local) == ModelIdentity.of_vectorizer(actor.vectorizer)
    assert described.runner == backend_of(local) == backend_of(actor.vectorizer)
    assert encoder_precision(described.identity.encoder) == ("bfloat16" if kind == BF16_KIND else "float32")
    assert described.runner == ("onnxruntime" if kind == OTHER_KIND else "torch")
    assert os.environ[CPU_KIND_ENV] == worker_kind  # the driver's kind was the loading's alone
    texts = ["a girl in a red dress", "tennis on a court", "a dog on the beach"]
    batch = pa.table({"pos": pa.array([0, 1, 2], type=pa.int64()), "text": texts})
    out = actor(batch)
    got = out.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(3, -1)
    want = local.encode(texts, "colour", batch_size=4)
    # one model, one batch: the same computation, up to the rounding of the precision it runs in
    eps = BF16_EPS if kind == BF16_KIND else EPS32
    np.testing.assert_allclose(got, want, atol=4 * eps / np.sqrt(got.shape[1]), rtol=0)


def test_the_path_travels_to_a_local_instance() -> None:
    ray = _FakeRay(TIMED_OUT, failures=0)
    seen: list[dict] = []
    ray.init = lambda **kwargs: seen.append(kwargs)  # type: ignore[method-assign]
    assert _connect(ray, RayConfig(), EncodePath(BF16_KIND, "auto")) is True
    assert seen[0]["runtime_env"]["env_vars"][CPU_KIND_ENV] == BF16_KIND
