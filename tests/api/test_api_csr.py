"""The Python API in router mode (issue 39): load_model(mode=, router=), Store.index(mode=, router=), one default.

The tiny BERT with an untrained router (``router="none"``) stands in for MiniLM and its trained
router. The mode a front end builds when none is named has one home,
:data:`condsearch.model.artifacts.profiles.DEFAULT_MODE`: the CLI's ``index --mode`` and the API read it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import condsearch
import condsearch.api as api
from condsearch.errors import CondsearchError, ModelError
from condsearch.model.artifacts import profiles
from condsearch.model.artifacts.profiles import DEFAULT_MODE, MODE_AUTO, MODES
from condsearch.query.hits import Hits
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES
from tests.tolerance import assert_rows_close, vector_tolerance

COLOUR = "color of the dress"
SPORT = "the sport being played"
IDS = [f"s{i}" for i in range(len(SENTENCES))]


@pytest.fixture(scope="module")
def csr_model(tiny_bert_dir: Path) -> condsearch.Model:
    return condsearch.load_model(str(tiny_bert_dir), mode="csr", router="none", device="cpu")


@pytest.fixture(scope="module")
def case_model(tiny_bert_dir: Path) -> condsearch.Model:
    return condsearch.load_model(str(tiny_bert_dir), mode="case", profile="none", device="cpu")


def _one_line(info: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(info.value)
    assert message and "\n" not in message
    return message


def _nothing_written(folder: Path) -> None:
    assert not folder.exists() or not IndexStore(folder).names()


# ---------------------------------------------------------------- one default


def test_the_default_mode_has_one_home_that_the_cli_and_the_api_read(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import click

    from condsearch.cli import main

    command = main.get_command(click.Context(main), "index")
    assert command is not None
    [mode] = [p for p in command.params if p.name == "mode"]
    assert mode.default == DEFAULT_MODE and DEFAULT_MODE in (MODE_AUTO, *MODES)
    # the API reads the constant when called, so changing that one value changes its default too
    assert inspect.signature(condsearch.load_model).parameters["mode"].default is None
    assert inspect.signature(condsearch.Store.index).parameters["mode"].default is None
    for default in MODES:
        monkeypatch.setattr(profiles, "DEFAULT_MODE", default)
        assert condsearch.load_model(str(tiny_bert_dir), device="cpu").mode == default
    # auto: a model no router ships for is a CASE one, unless a router is named
    monkeypatch.setattr(profiles, "DEFAULT_MODE", MODE_AUTO)
    assert condsearch.load_model(str(tiny_bert_dir), device="cpu").mode == "case"
    assert condsearch.load_model(str(tiny_bert_dir), device="cpu", router="none").mode == "csr"


def test_auto_is_the_router_for_the_default_model_unless_a_case_setting_is_named() -> None:
    from condsearch.base.model_sources import DEFAULT_MODEL

    resolve = profiles.resolve_mode
    assert DEFAULT_MODE == MODE_AUTO  # issue 39: the router loses least out of the caption domain
    assert resolve("auto") == resolve("auto", DEFAULT_MODEL) == "csr"
    assert resolve("auto", case_settings=True) == "case"  # --profile, --head, --pooling, … ask for CASE
    assert resolve("auto", "some/other-model") == "case"  # no router ships for it
    assert resolve("auto", "some/other-model", router=True) == "csr"
    assert resolve("auto", case_settings=True, router=True) == "csr"  # csr's own check then refuses the CASE flag
    assert resolve("case") == "case" and resolve("csr", "some/other-model") == "csr"
    with pytest.raises(CondsearchError, match="mode must be 'auto', 'case' or 'csr', not 'bert'"):
        resolve("bert")


# ---------------------------------------------------------------- load_model


@pytest.mark.numerics
def test_a_csr_model_encodes_unit_vectors_through_its_router(csr_model: condsearch.Model) -> None:
    assert csr_model.mode == "csr" and csr_model.vectorizer.mode == "csr" and csr_model.dim == 32
    assert csr_model.vectorizer.encoder.describe()["router"] == "none"
    out = csr_model.encode(["a girl in a red dress", "a dog"], condition=COLOUR)
    assert out.shape == (2, csr_model.dim) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    # the vectorizer's own vectors, alone or in a padded batch of two, up to float32 rounding
    assert_rows_close(out, csr_model.vectorizer.encode(["a girl in a red dress", "a dog"], COLOUR), 0.0)
    alone = csr_model.encode(["a dog"], condition=COLOUR)
    assert_rows_close(alone, out[1:], vector_tolerance(csr_model.vectorizer, ["a dog"], COLOUR))
    for texts, condition, match in (
        ("a dog", COLOUR, "list of texts"),
        (["a dog"], " ", "the condition is empty"),
        (["a", 5], COLOUR, "texts must be strings, not int"),
    ):
        with pytest.raises(CondsearchError, match=match):
            csr_model.encode(texts, condition=condition)  # type: ignore[arg-type]


def test_a_case_model_says_its_mode(case_model: condsearch.Model) -> None:
    assert case_model.mode == "case" and case_model.vectorizer.mode == "case"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "CSR"}, "mode must be 'auto', 'case' or 'csr', not 'CSR'"),
        ({"mode": 1}, "mode must be 'auto', 'case' or 'csr', not 1"),
        ({"mode": "case", "router": "none"}, "router= applies to mode='csr'"),
        ({"mode": "csr", "profile": "lora"}, "profile= applies to mode='case'"),
        ({"mode": "csr", "router": 5}, "router must be 'auto', 'default', 'none' or a router folder, not int"),
        ({"mode": "csr", "router": " "}, "router must be 'auto', 'default', 'none' or a router folder, not ' '"),
        ({"mode": "csr", "router": "no/such/router"}, "router 'no/such/router': no such folder"),
    ],
)
def test_load_model_refuses_bad_modes_and_routers_in_one_line(tiny_bert_dir: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(CondsearchError, match=re.escape(match)) as info:
        condsearch.load_model(str(tiny_bert_dir), device="cpu", **kwargs)
    _one_line(info)


def test_quantize_in_csr_mode_is_honoured_or_refused_never_dropped(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8 under the router runs as int8 where the router supports it, and is refused in one line where not."""
    from dataclasses import replace

    import condsearch.model.vectorizer as vectorizer

    refusal = "quantize='int8' does not apply to mode='csr' here: its model runs in float32"
    try:
        model = condsearch.load_model(str(tiny_bert_dir), mode="csr", router="none", quantize="int8", device="cpu")
    except CondsearchError as exc:
        assert str(exc) == refusal
    else:
        assert model.vectorizer.encoder.describe()["quantize"] == "int8"
    with pytest.raises(ModelError, match="unknown quantisation 'int4'"):
        condsearch.load_model(str(tiny_bert_dir), mode="csr", quantize="int4")  # type: ignore[arg-type]
    # an encoder that loads as float32 whatever it is asked: refused, not a float32 model said to be int8
    real = vectorizer.load_vectorizer
    monkeypatch.setattr(vectorizer, "load_vectorizer", lambda spec: real(replace(spec, quantize="none")))
    with pytest.raises(ModelError) as info:
        condsearch.load_model(str(tiny_bert_dir), mode="csr", router="none", quantize="int8", device="cpu")
    assert str(info.value) == refusal


def test_a_router_folder_that_holds_no_router_is_a_model_error(tiny_bert_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as info:
        condsearch.load_model(str(tiny_bert_dir), mode="csr", router=tmp_path, device="cpu")
    _one_line(info)


# ---------------------------------------------------------------- Store.index


def test_a_store_indexes_and_searches_in_csr_mode(tmp_path: Path, csr_model: condsearch.Model) -> None:
    store = condsearch.open(tmp_path, model=csr_model)
    names = store.index(list(SENTENCES), [COLOUR, SPORT], ids=IDS, name="c")
    manifests = [IndexStore(tmp_path).read_manifest(n) for n in names]
    assert [m.mode for m in manifests] == ["csr", "csr"]
    assert all(m.encoder["router"] == "none" for m in manifests)
    hits = store.search(SENTENCES[2], condition=COLOUR, k=3)
    assert isinstance(hits, Hits) and hits[0].id == "s2" and hits[0].text == SENTENCES[2]
    # a fresh store loads the router each index records, and answers the same
    again = condsearch.open(tmp_path).search([SENTENCES[2], SENTENCES[5]], condition=COLOUR, k=3)
    assert [h.id for h in again[0]] == [h.id for h in hits]
    assert again[0][0].score == pytest.approx(hits[0].score, abs=1e-5)
    # the vectors stored are the model's
    vectors = np.load(tmp_path / names[0] / "vectors.npy")
    expected = csr_model.encode(list(SENTENCES), condition=COLOUR)
    assert_rows_close(vectors, expected, vector_tolerance(csr_model.vectorizer, list(SENTENCES), COLOUR))


def test_index_with_a_mode_loads_that_model_once(
    tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a model of its own, a store loads the default model in the mode and router asked for."""
    loads: list[dict[str, Any]] = []
    real = api.load_model

    def tiny(model: str | None = None, **kwargs: Any) -> condsearch.Model:  # the tiny BERT for the default model
        loads.append(kwargs)
        return real(str(tiny_bert_dir), **kwargs)

    monkeypatch.setattr(api, "load_model", tiny)
    store = condsearch.open(tmp_path, device="cpu")
    [csr] = store.index(list(SENTENCES), COLOUR, ids=IDS, name="c", mode="csr", router="none")
    [sport] = store.index(list(SENTENCES), SPORT, ids=IDS, name="c", mode="csr", router="none")
    assert len(loads) == 1 and loads[0]["mode"] == "csr" and loads[0]["router"] == "none"
    assert loads[0]["device"] == "cpu"
    [case] = store.index(list(SENTENCES), COLOUR, ids=IDS, name="d", mode="case")
    assert len(loads) == 2 and loads[1]["mode"] == "case" and loads[1]["router"] is None
    modes = {n: IndexStore(tmp_path).read_manifest(n).mode for n in (csr, sport, case)}
    assert modes == {csr: "csr", sport: "csr", case: "case"}
    assert store.search(SENTENCES[4], condition=SPORT, k=1)[0].id == "s4"
    with pytest.raises(CondsearchError, match="indexed for several corpora"):
        store.search(SENTENCES[4], condition=COLOUR, k=1)  # corpora c and d: name one
    assert store.search(SENTENCES[4], condition=COLOUR, k=1, corpus="d")[0].id == "s4"
    assert len(loads) == 2  # searches reuse the models that built the indexes


def test_index_refuses_a_mode_or_router_that_conflicts_with_the_store_s_model(
    tmp_path: Path, csr_model: condsearch.Model, case_model: condsearch.Model
) -> None:
    folder = tmp_path / "idx"
    refused = [
        (case_model, {"mode": "csr"}, "mode='csr' conflicts with the store's model (mode 'case')"),
        (csr_model, {"mode": "case"}, "mode='case' conflicts with the store's model (mode 'csr')"),
        (case_model, {"router": "none"}, "router= applies to mode='csr'"),
        (csr_model, {"router": "default"}, "router='default' conflicts with the store's model (router 'none')"),
        (csr_model, {"mode": "bogus"}, "mode must be 'auto', 'case' or 'csr', not 'bogus'"),
        (csr_model, {"router": 3}, "router must be 'auto', 'default', 'none' or a router folder, not int"),
    ]
    for model, kwargs, match in refused:
        with pytest.raises(CondsearchError, match=re.escape(match)) as info:
            condsearch.open(folder, model=model).index(["a dog"], COLOUR, **kwargs)
        _one_line(info)
    _nothing_written(folder)
    # the store's own mode and router, named again, are no conflict
    agree = condsearch.open(folder, model=csr_model).index(["a dog"], COLOUR, mode="csr", router="none")
    assert IndexStore(folder).read_manifest(agree[0]).mode == "csr"
    assert condsearch.open(folder, model=csr_model).index(["a dog"], COLOUR, router="auto")  # auto: the tiny's none


def test_a_milvus_store_refuses_index_with_a_mode_too(tmp_path: Path) -> None:
    store = condsearch.open(f"milvus-lite:{tmp_path / 'm.db'}")
    with pytest.raises(CondsearchError, match="a Milvus store is searched here"):
        store.index(["a"], COLOUR, mode="csr", router="none")
