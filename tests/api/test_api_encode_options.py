"""Model.encode speaks sentence-transformers' options, and loading a model in library use draws no bar (issue 59)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import condsearch
from condsearch.errors import CondsearchError
from tests.tolerance import assert_rows_close, vector_tolerance

COLOUR = "color of the dress"
TEXTS = ["a girl in a red dress", "a dog", "two men in blue suits walk by the river at dusk"]


@pytest.fixture(scope="module")
def model(tiny_bert_dir: Path) -> condsearch.Model:
    return condsearch.load_model(str(tiny_bert_dir), mode="case", profile="none", device="cpu")


def test_batch_size_changes_the_batches_not_the_vectors(model: condsearch.Model) -> None:
    whole = model.encode(TEXTS, COLOUR)
    one_by_one = model.encode(TEXTS, COLOUR, batch_size=1)
    assert_rows_close(one_by_one, whole, vector_tolerance(model.vectorizer, TEXTS, COLOUR))
    np.testing.assert_allclose(np.linalg.norm(one_by_one, axis=1), 1.0, atol=1e-5)


def test_show_progress_bar_opens_a_bar_only_when_asked(
    model: condsearch.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.model.encoders.base as base
    from condsearch.progress import progress_bar

    asked: list[bool] = []

    def recording(**kwargs: object):  # type: ignore[no-untyped-def]
        asked.append(bool(kwargs.get("enabled", True)))
        return progress_bar(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(base, "progress_bar", recording)
    model.encode(TEXTS, COLOUR, batch_size=1)
    assert asked and not any(asked)
    asked.clear()
    model.encode(TEXTS[::-1], COLOUR, batch_size=1, show_progress_bar=True)
    assert any(asked)


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "8"])
def test_a_bad_batch_size_is_one_line(model: condsearch.Model, bad: object) -> None:
    with pytest.raises(CondsearchError, match="batch_size must be a positive integer"):
        model.encode(TEXTS, COLOUR, batch_size=bad)  # type: ignore[arg-type]


def test_unnormalised_vectors_are_refused_not_faked(model: condsearch.Model) -> None:
    assert np.allclose(np.linalg.norm(model.encode(TEXTS, COLOUR, normalize_embeddings=True), axis=1), 1.0, atol=1e-5)
    with pytest.raises(CondsearchError, match="always unit length"):
        model.encode(TEXTS, COLOUR, normalize_embeddings=False)


def test_loading_a_model_in_library_use_draws_no_bar(tiny_bert_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()  # other tests (the CLI's) may have turned it off
    hf_logging.enable_progress_bar()
    try:
        condsearch.load_model(str(tiny_bert_dir), mode="case", profile="none", device="cpu")
        assert "Loading weights" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled()  # the caller's own setting is left as it was
    finally:
        if not was:
            hf_logging.disable_progress_bar()
