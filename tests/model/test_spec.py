"""The encoder spec: saved in each manifest, read back from older manifests, loaded into the same vectors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.errors import StoreError
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.policy import vectorizer_for
from condsearch.model.vectorizer import load_vectorizer
from condsearch.store.folder import IndexStore
from condsearch.store.manifest import FORMAT_VERSION

COLOUR = "the colour"
TEXTS = ["a red dress", "a blue car", "a green hat"]
CPU = Runtime(device="cpu")


def _manifest(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path, *flags: str):  # noqa: ANN202
    args = ["index", str(corpus_file), "-c", COLOUR, "--model", str(tiny_bert_dir), "--index-dir", str(index_dir)]
    result = CliRunner().invoke(main, [*args, *flags])
    assert result.exit_code == 0, result.output
    store = IndexStore(index_dir)
    return store.read_manifest(store.find(COLOUR))


def test_to_dict_leaves_the_runtime_out_and_from_dict_gives_the_spec_back() -> None:
    spec = EncoderSpec("m", profile="full", max_length=64, runtime=Runtime(device="cuda:1", threads=3))
    saved = spec.to_dict()
    assert "runtime" not in saved and saved["model"] == "m" and saved["max_length"] == 64
    assert EncoderSpec.from_dict(saved) == spec  # the runtime is not part of what a spec is
    assert EncoderSpec.from_dict(saved, runtime=CPU).runtime == CPU


def test_a_spec_field_this_version_does_not_know_is_a_one_line_re_index() -> None:
    with pytest.raises(StoreError, match="re-index"):
        EncoderSpec.from_dict({**EncoderSpec().to_dict(), "colour": "red"})


@pytest.mark.parametrize("flags", [("--head", "none"), ("--mode", "csr", "--router", "none")], ids=["case", "csr"])
def test_the_manifest_spec_is_what_an_older_manifest_reads_as_and_loads_the_same_vectors(
    flags: tuple[str, ...], tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    manifest = _manifest(tiny_bert_dir, corpus_file, tmp_path / "idx", *flags)
    assert manifest.format_version == FORMAT_VERSION and manifest.spec
    older = replace(manifest, spec={}, format_version=4)  # written before the manifest held a spec
    assert EncoderSpec.of_manifest(older) == EncoderSpec.of_manifest(manifest)
    want = vectorizer_for(manifest, runtime=CPU).encode(TEXTS, COLOUR)
    np.testing.assert_array_equal(vectorizer_for(older, runtime=CPU).encode(TEXTS, COLOUR), want)
    # and the spec alone loads them too: a vectorizer's spec is the manifest's
    loaded = load_vectorizer(EncoderSpec.of_manifest(manifest, runtime=CPU))
    assert loaded.spec.to_dict() == manifest.spec
    np.testing.assert_array_equal(loaded.encode(TEXTS, COLOUR), want)  # the same loader, weights and inputs: same bits


def test_a_saved_revision_that_no_longer_resolves_is_refused(tiny_bert_dir: Path) -> None:
    with pytest.raises(Exception, match="no longer resolves"):
        load_vectorizer(EncoderSpec(str(tiny_bert_dir), revision="not-this-one", runtime=CPU))
