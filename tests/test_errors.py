"""Error messages: the first line of an exception, whatever its message looks like."""

from __future__ import annotations

from pathlib import Path

import pytest

from condsearch.errors import ModelError


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OSError(), "OSError"),
        (ValueError(""), "ValueError"),
        (KeyError(), "KeyError"),
        (RuntimeError("   \n  "), "RuntimeError"),
        (RuntimeError("first\nsecond"), "first"),
        (RuntimeError("\n\n  real message  \nmore"), "real message"),
    ],
)
def test_first_line(exc: BaseException, expected: str) -> None:
    from condsearch.errors import first_line

    assert first_line(exc) == expected


@pytest.mark.parametrize(("message", "expected"), [("", ""), ("  \n ", ""), ("\n why \nmore", "why")])
def test_first_line_of_a_string(message: str, expected: str) -> None:
    from condsearch.errors import first_line

    assert first_line(message) == expected


def test_os_reason_is_the_system_message_or_the_first_line() -> None:
    from condsearch.errors import os_reason

    assert os_reason(PermissionError(13, "Permission denied", "/x")) == "Permission denied"
    assert os_reason(OSError("disk gone\nmore")) == "disk gone"
    assert os_reason(OSError()) == "OSError"


@pytest.mark.parametrize("loader", ["AutoTokenizer", "AutoModel"])
def test_csr_encoder_load_error_with_empty_message(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch, loader: str
) -> None:
    import transformers

    from condsearch.base.model_sources import resolve_model
    from condsearch.model.csr.encoder import CsrEncoder

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError()  # an empty message: no first line to take

    monkeypatch.setattr(getattr(transformers, loader), "from_pretrained", fail)
    with pytest.raises(ModelError, match="OSError"):
        CsrEncoder(resolve_model(str(tiny_bert_dir)))


def test_encoder_load_error_with_empty_message(tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec

    def fail(*args: object, **kwargs: object) -> None:
        raise ValueError()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    with pytest.raises(ModelError, match="ValueError"):
        load_encoder(EncoderSpec(str(tiny_bert_dir)))
