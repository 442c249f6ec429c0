"""The one model loader (issue 60): each purpose reaches the loader it always did, with the same arguments.

No model loads here: the implementations in condsearch.model.policy and condsearch.model.vectorizer are
replaced by recorders, which is also what the loader promises (each is looked up when called).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from condsearch.model import OneShotQuery, load_model_for
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.one_shot import ONE_SHOT_THREADS

CASE = SimpleNamespace(mode="case")
CSR = SimpleNamespace(mode="csr")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []

    def recorder(name: str, backend: str = "torch") -> Any:
        def load(*args: Any, **kwargs: Any) -> SimpleNamespace:
            seen.append((name, args, kwargs))
            return SimpleNamespace(backend=backend)

        return load

    monkeypatch.setattr("condsearch.model.vectorizer.load_vectorizer", recorder("load_vectorizer"))
    monkeypatch.setattr("condsearch.model.policy.vectorizer_for", recorder("vectorizer_for"))
    monkeypatch.setattr("condsearch.model.policy.load_bulk_vectorizer", recorder("load_bulk_vectorizer"))
    monkeypatch.setattr("condsearch.model.policy.load_index_model", recorder("load_index_model", "onnxruntime"))
    monkeypatch.setattr("condsearch.model.one_shot.cache_onnx_export", recorder("cache_onnx_export"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return seen


def test_each_purpose_reaches_its_loader(calls: list[tuple[Any, ...]]) -> None:
    spec, run = EncoderSpec(), Runtime(device="cpu", threads=3)
    load_model_for("plain", spec)
    load_model_for("bulk", spec)
    load_model_for("bulk", spec, backend="torch")
    load_model_for("resident", CASE, runtime=run)  # type: ignore[arg-type]
    load_model_for("resident", CSR, runtime=run, backend="torch", quantize="int8")  # type: ignore[arg-type]
    load_model_for("plain", CSR, runtime=run, model="m", profile="p", quantize="none")  # type: ignore[arg-type]
    assert calls == [
        ("load_vectorizer", (spec,), {}),
        ("load_bulk_vectorizer", (spec,), {"backend": "auto"}),
        ("load_bulk_vectorizer", (spec,), {"backend": "torch"}),
        ("load_index_model", (CASE,), {"runtime": run, "backend": "auto", "quantize": None}),
        ("load_index_model", (CSR,), {"runtime": run, "backend": "torch", "quantize": "int8"}),
        ("vectorizer_for", (CSR,), {"model": "m", "profile": "p", "quantize": "none", "runtime": run}),
    ]


def test_an_argument_that_does_not_apply_is_refused(calls: list[tuple[Any, ...]]) -> None:
    with pytest.raises(TypeError, match="takes no"):
        load_model_for("bulk", EncoderSpec(), runtime=Runtime())  # a spec carries its runtime
    with pytest.raises(TypeError, match="takes no"):
        load_model_for("resident", CASE, model="m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="manifest"):
        load_model_for("resident", EncoderSpec())
    with pytest.raises(TypeError, match="EncoderSpec"):
        load_model_for("bulk", CASE)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="OneShotQuery"):
        load_model_for("one_shot", CASE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown purpose"):
        load_model_for("batch", EncoderSpec())  # type: ignore[arg-type]
    assert calls == []


def test_one_shot_policy(calls: list[tuple[Any, ...]]) -> None:
    # a few queries of a CASE index: as the server loads it, on the CPU, one thread
    few = OneShotQuery(1, Runtime())
    vec = load_model_for("one_shot", CASE, query=few)  # type: ignore[arg-type]
    assert calls[-1] == (
        "load_index_model",
        (CASE,),
        {"runtime": Runtime(device="cpu", threads=ONE_SHOT_THREADS), "quantize": None},
    )
    few.cache_export(CASE, vec)  # type: ignore[arg-type]  # served: nothing to write
    # a few queries of a router index: its one-shot path first, torch on one thread otherwise
    vec = load_model_for("one_shot", CSR, query=few)  # type: ignore[arg-type]
    assert calls[-1] == (
        "vectorizer_for",
        (CSR,),
        {
            "model": None,
            "profile": None,
            "quantize": None,
            "runtime": Runtime(threads=1),
            "one_shot": True,
            "one_condition": True,
        },
    )
    few.cache_export(CSR, vec)  # type: ignore[arg-type]  # torch answered: the export for the next query
    assert calls[-1][0] == "cache_onnx_export"
    # many queries, threads asked for, a GPU or an override: torch, the CPU's threads as given
    n = len(calls)
    many = OneShotQuery(17, Runtime(threads=4))
    load_model_for("one_shot", CASE, query=many)  # type: ignore[arg-type]
    assert calls[-1][2] == {"runtime": Runtime(threads=4), "quantize": None}
    many.cache_export(CSR, SimpleNamespace(backend="torch"))  # type: ignore[arg-type]
    on_gpu = OneShotQuery(1, Runtime(device="cuda"), quantize="int8")
    load_model_for("one_shot", CSR, query=on_gpu)  # type: ignore[arg-type]
    assert calls[-1][2]["runtime"] == Runtime(device="cuda", threads=1)
    assert calls[-1][2]["one_shot"] is False and calls[-1][2]["quantize"] == "int8"
    overridden = OneShotQuery(1, Runtime(device="cpu"), profile="none")
    load_model_for("one_shot", CASE, query=overridden)  # type: ignore[arg-type]
    assert calls[-1][0] == "vectorizer_for" and calls[-1][2]["one_shot"] is False
    overridden.cache_export(CSR, SimpleNamespace(backend="torch"))  # type: ignore[arg-type]
    assert [c[0] for c in calls[n:]] == ["load_index_model", "vectorizer_for", "vectorizer_for"]


def test_omp_num_threads_keeps_torchs_threads(calls: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    load_model_for("one_shot", CSR, query=OneShotQuery(1, Runtime()))  # type: ignore[arg-type]
    assert calls[-1][2]["runtime"] == Runtime()
