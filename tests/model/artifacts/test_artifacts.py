"""Artifacts: PEFT's adapter format (and the old one), the converter, profiles and the flags that name them."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

from condsearch.base import artifact_files as files
from condsearch.model.artifacts.adapters import read_adapter
from condsearch.model.artifacts.convert import convert_legacy_adapter
from condsearch.model.artifacts.profiles import Profile, ProfileError, recorded_profile, resolve_profile
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.head import HeadConfig, ProjectionHead, save_head
from condsearch.model.vectorizer import load_vectorizer
from tests.cli.test_cli import assert_clean_error, ok, run
from tests.conftest import SENTENCES
from tests.model.encoders.test_onnx_trace import _adapter
from tests.tolerance import float32_tolerance, largest_activation, transformer_depth

COLOUR = "color of the dress"


def _trained(tiny_bert_dir: Path, out: Path, *, head: bool = False) -> Path:
    """Save a rank-2 adapter whose B is random (a fresh one is the identity), with a 16-d head beside it when asked."""
    _adapter(tiny_bert_dir, out)
    if head:
        config = HeadConfig(input_dim=32, dim=16, model_id=str(tiny_bert_dir), encoder_pooling="condition-mean")
        save_head(ProjectionHead(config), out.with_name(f"{out.name}-head"))
        for name in (files.HEAD_CONFIG, files.HEAD_WEIGHTS):
            shutil.copy2(out.with_name(f"{out.name}-head") / name, out / name)
    return out


def _legacy(peft_folder: Path, out: Path) -> Path:
    """Write the same adapter in condsearch's first format (what folders trained before PEFT's hold)."""
    adapter = read_adapter(peft_folder)
    state = load_file(str(adapter.weights))
    prefix = "base_model.model."
    old = {k.removeprefix(prefix).replace(".lora_A.weight", ".lora_a").replace(".lora_B.weight", ".lora_b"): v
           for k, v in state.items()}  # fmt: skip
    out.mkdir()
    save_file({k: torch.from_numpy(v) for k, v in old.items()}, str(out / files.NATIVE_ADAPTER_WEIGHTS))
    meta = {k: v for k, v in adapter.meta.items() if k not in ("format_version", "weights_sha256")}
    meta |= {"format_version": 1, "kind": "lora", "rank": 2, "alpha": 32.0, "dropout": 0.1}
    (out / files.NATIVE_ADAPTER_CONFIG).write_text(json.dumps(meta))
    return out


# --- PEFT's format ---------------------------------------------------------------------------


def test_a_saved_adapter_has_peft_files_keys_and_shapes(tiny_bert_dir: Path, tmp_path: Path) -> None:
    out = _trained(tiny_bert_dir, tmp_path / "ad")
    assert sorted(p.name for p in out.iterdir()) == [files.PEFT_CONFIG, files.PEFT_WEIGHTS, files.ADAPTER_SIDECAR]
    config = json.loads((out / files.PEFT_CONFIG).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["bias"]) == ("LORA", 2, 32.0, "none")
    assert config["task_type"] == "FEATURE_EXTRACTION" and config["base_model_name_or_path"] == str(tiny_bert_dir)
    state = load_file(str(out / files.PEFT_WEIGHTS))
    modules = set(config["target_modules"])
    assert len(modules) == 2 * 6  # two layers, six projections each
    assert set(state) == {f"base_model.model.{m}.lora_{ab}.weight" for m in modules for ab in "AB"}
    a, b = (
        state["base_model.model.encoder.layer.0.attention.self.query.lora_A.weight"],
        state["base_model.model.encoder.layer.0.attention.self.query.lora_B.weight"],
    )
    assert a.shape == (2, 32) and b.shape == (32, 2) and a.dtype == np.float16
    sidecar = json.loads((out / files.ADAPTER_SIDECAR).read_text())
    assert sidecar["format_version"] == files.ADAPTER_FORMAT_VERSION and sidecar["kind"] == "lora"
    assert sidecar["weights_sha256"] == hashlib.sha256((out / files.PEFT_WEIGHTS).read_bytes()).hexdigest()
    assert sidecar["encoder_pooling"] == "condition-mean" and files.artifact_kind(out) == "adapter"


@pytest.mark.numerics
def test_peft_loads_our_adapter_with_our_outputs(tiny_bert_dir: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    from transformers import AutoModel, AutoTokenizer

    out = _trained(tiny_bert_dir, tmp_path / "ad")
    ours = load_encoder(
        EncoderSpec(str(tiny_bert_dir), adapter=out, runtime=Runtime(device="cpu"))
    )  # merged into the weights
    theirs = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(str(tiny_bert_dir)), str(out)).eval()
    batch = AutoTokenizer.from_pretrained(str(tiny_bert_dir))(SENTENCES[:3], padding=True, return_tensors="pt")
    with torch.no_grad(), largest_activation(ours.model) as found:
        want = ours.model(**batch).last_hidden_state
        got = theirs(**batch).last_hidden_state
        plain = AutoModel.from_pretrained(str(tiny_bert_dir)).eval()(**batch).last_hidden_state
    # PEFT adds x·A·B beside x·W; ours multiplies by W + B·A: two more roundings at each product's magnitude
    tolerance = float32_tolerance(max(found), depth=transformer_depth(ours.model) + 2)
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
    assert not torch.allclose(plain, want, atol=1e-3)  # the adapter changes the outputs


def test_the_old_format_still_loads_with_the_same_vectors(tiny_bert_dir: Path, tmp_path: Path) -> None:
    new = _trained(tiny_bert_dir, tmp_path / "new")
    old = _legacy(new, tmp_path / "old")
    assert read_adapter(old).format_version == 1 and files.artifact_kind(old) == "adapter"
    got = load_encoder(EncoderSpec(str(tiny_bert_dir), adapter=old, runtime=Runtime(device="cpu"))).encode(
        SENTENCES, COLOUR
    )
    want = load_encoder(EncoderSpec(str(tiny_bert_dir), adapter=new, runtime=Runtime(device="cpu"))).encode(
        SENTENCES, COLOUR
    )
    np.testing.assert_array_equal(got, want)
    # loaded again, the same weights on the same inputs: the same computation, so the same bits
    again = load_encoder(EncoderSpec(str(tiny_bert_dir), adapter=old, runtime=Runtime(device="cpu")))
    np.testing.assert_array_equal(again.encode(SENTENCES, COLOUR), got)


def test_conversion_keeps_tensors_identity_and_vectors(tiny_bert_dir: Path, tmp_path: Path) -> None:
    old = _legacy(_trained(tiny_bert_dir, tmp_path / "new"), tmp_path / "old")
    old_checksum = hashlib.sha256((old / files.NATIVE_ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    want = load_encoder(EncoderSpec(str(tiny_bert_dir), adapter=old, runtime=Runtime(device="cpu")))
    assert convert_legacy_adapter(old, tmp_path / "converted") == old_checksum
    converted = load_encoder(
        EncoderSpec(str(tiny_bert_dir), adapter=tmp_path / "converted", runtime=Runtime(device="cpu"))
    )
    assert converted.describe() == want.describe()  # the same adapter_checksum: indexes built with old still load
    np.testing.assert_array_equal(converted.encode(SENTENCES, COLOUR), want.encode(SENTENCES, COLOUR))
    # in place, as the shipped asset was converted
    assert convert_legacy_adapter(old) == old_checksum and read_adapter(old).format_version == 2
    with pytest.raises(Exception, match="first format"):
        convert_legacy_adapter(old)


def test_the_shipped_adapter_is_in_peft_format_with_its_old_identity() -> None:
    adapter = read_adapter(files.LORA_PROFILE_DIR)
    assert adapter.format_version == 2 and adapter.lora is not None and adapter.lora.rank == 16
    converted = adapter.meta["converted_from"]
    assert isinstance(converted, dict) and adapter.checksum == converted["adapter_checksum"]
    assert not (files.LORA_PROFILE_DIR / files.NATIVE_ADAPTER_WEIGHTS).exists()


# --- profiles --------------------------------------------------------------------------------


def test_profile_names_aliases_and_conflicts(tiny_bert_dir: Path, tmp_path: Path) -> None:
    ad = _trained(tiny_bert_dir, tmp_path / "ad")
    both = _trained(tiny_bert_dir, tmp_path / "both", head=True)
    shipped = resolve_profile(profile="default")
    assert shipped == resolve_profile(head="default") == resolve_profile(profile="full")  # an alias, both ways
    assert shipped.name == "full" and shipped.adapter == files.FULL_PROFILE_DIR.resolve() and shipped.head is None
    lora = resolve_profile(profile="lora")
    assert lora.name == "lora" and lora.adapter == lora.head == files.LORA_PROFILE_DIR.resolve()
    frozen = resolve_profile(head="frozen")
    assert frozen.adapter is None and frozen.head == files.FROZEN_HEAD_DIR.resolve()
    assert resolve_profile(str(tiny_bert_dir)) == Profile()  # auto: none for another model
    assert resolve_profile(profile=str(both)) == Profile(str(both.resolve()), both.resolve(), both.resolve())
    assert resolve_profile(head=str(both)) == resolve_profile(adapter=both, head=str(both))
    alone = resolve_profile(adapter=ad)
    assert (alone.name, alone.head, alone.separate_adapter) == ("none", None, str(ad.resolve()))
    for flags in (
        {"profile": "default", "head": "none"},
        {"profile": "frozen", "adapter": ad},
        {"adapter": ad, "head": "default"},
        {"adapter": ad, "head": "lora"},
        {"adapter": ad, "head": str(both)},  # a head folder with an adapter of its own
        {"router": "default"},
    ):
        with pytest.raises(ProfileError):
            resolve_profile(**flags)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="--mode case only"):
        resolve_profile(adapter=ad, mode="csr")


def test_an_index_rebuilds_its_profile(tiny_bert_dir: Path, tmp_path: Path) -> None:
    ad = _trained(tiny_bert_dir, tmp_path / "ad")
    head_dir = tmp_path / "head"
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=8, model_id=str(tiny_bert_dir))), head_dir)
    vec = load_vectorizer(
        EncoderSpec(str(tiny_bert_dir), head=str(head_dir), adapter=str(ad), runtime=Runtime(device="cpu"))
    )
    described = vec.encoder.describe()
    assert described["adapter"] == str(ad.resolve()) and vec.profile_name == str(head_dir.resolve()) and vec.dim == 8
    assert EncoderSpec.recorded(described, "case", vec.profile_name).resolve_profile() == vec.profile
    # a profile folder records no separate adapter: manifests of before --adapter still match
    both = _trained(tiny_bert_dir, tmp_path / "both", head=True)
    assert (
        "adapter"
        not in load_vectorizer(
            EncoderSpec(str(tiny_bert_dir), profile=str(both), runtime=Runtime(device="cpu"))
        ).encoder.describe()
    )


def test_an_index_from_when_lora_was_the_default_still_names_lora() -> None:
    from condsearch.base.model_sources import DEFAULT_MODEL

    # such manifests say head 'default'; new ones never do (the name is resolved before it is recorded)
    assert recorded_profile("default") == "lora" and recorded_profile("full") == "full"
    recorded = EncoderSpec.recorded({"model_id": DEFAULT_MODEL}, "case", "default")
    old = recorded.resolve_profile()
    assert old == resolve_profile(profile="lora") and old.name == "lora"
    full = EncoderSpec.recorded({"model_id": DEFAULT_MODEL}, "case", "full").resolve_profile()
    assert full == resolve_profile(profile="default")
    # a --head asked for at query time (as vectorizer_for asks it) names today's profiles: its 'default' is full
    asked = replace(recorded, profile=None, head="default").resolve_profile()
    assert asked.name == "full"


def test_cli_index_with_adapter_and_head_then_query(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    ad = _trained(tiny_bert_dir, tmp_path / "ad")
    head_dir = tmp_path / "head"
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=8, model_id=str(tiny_bert_dir))), head_dir)
    index_dir = tmp_path / "idx"
    common = ["--model", tiny_bert_dir, "--index-dir", index_dir, "--device", "cpu"]
    ok(run("index", corpus_file, "-c", COLOUR, "--adapter", ad, "--head", head_dir, *common))
    manifest = json.loads(next(index_dir.glob("*/manifest.json")).read_text())
    assert manifest["head"] == str(head_dir.resolve()) and manifest["encoder"]["adapter"] == str(ad.resolve())
    hits = json.loads(ok(run("query", SENTENCES[0], "-c", COLOUR, "-k", 2, "--index-dir", index_dir, "--json")).stdout)
    assert len(hits["results"]) == 2
    result = run("index", corpus_file, "-c", COLOUR, "--profile", "frozen", "--adapter", ad, *common)
    assert "--profile names the adapter and head together" in assert_clean_error(result, code=2)
    result = run("index", corpus_file, "-c", COLOUR, "--mode", "case", "--router", "default", *common)
    assert "--mode csr" in assert_clean_error(result, code=2)


def test_the_shipped_full_profile_is_a_small_rank_64_delta_of_the_default_model() -> None:
    profile = resolve_profile(None, profile="full")
    assert profile.adapter == files.FULL_PROFILE_DIR.resolve() and profile.head is None
    meta = read_adapter(files.FULL_PROFILE_DIR).meta
    assert meta["kind"] == "delta" and meta["rank"] == 64
    assert meta["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert sum(f.stat().st_size for f in files.FULL_PROFILE_DIR.iterdir()) < 10 * 2**20  # the repository's limit
