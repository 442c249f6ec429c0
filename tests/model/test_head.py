"""The projection head: shape, save -> load round trip, refusal of damaged files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.base.artifact_files import FROZEN_HEAD_DIR, LORA_PROFILE_DIR
from condsearch.base.artifact_files import HEAD_CONFIG as CONFIG_FILE
from condsearch.base.artifact_files import HEAD_WEIGHTS as WEIGHTS_FILE
from condsearch.errors import ModelError
from condsearch.model.artifacts.heads import HeadConfig, head_checksum
from condsearch.model.head import ProjectionHead, load_head, save_head


def _head(input_dim: int = 32, dim: int = 8, seed: int = 0) -> ProjectionHead:
    torch.manual_seed(seed)
    return ProjectionHead(HeadConfig(input_dim=input_dim, dim=dim, model_id="test/hash", model_revision="1"))


def test_head_architecture() -> None:
    head = _head()
    assert head.linear.bias is None
    assert head.linear.weight.shape == (8, 32)
    assert isinstance(head.act, torch.nn.LeakyReLU) and head.act.negative_slope == 0.01
    assert isinstance(head.dropout, torch.nn.Dropout) and head.dropout.p == 0.15


def test_project_is_deterministic_and_in_eval_mode() -> None:
    head = _head().train()
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    a, b = head.project(x), head.project(x)
    np.testing.assert_array_equal(a, b)  # no dropout when projecting
    assert a.shape == (5, 8) and a.dtype == np.float32
    assert head.training  # project() restores the mode it found
    w = head.linear.weight.detach().numpy()
    z = x @ w.T
    np.testing.assert_allclose(a, np.where(z > 0, z, 0.01 * z), atol=1e-5)


def test_save_load_round_trip(tmp_path: Path) -> None:
    head = _head()
    checksum = save_head(head, tmp_path / "h", extra={"note": "test"})
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert checksum == head_checksum(tmp_path / "h") and len(checksum) == 64
    meta = json.loads((tmp_path / "h" / CONFIG_FILE).read_text())
    assert meta["format_version"] == 1 and meta["input_dim"] == 32 and meta["dim"] == 8 and meta["note"] == "test"
    loaded = load_head(tmp_path / "h")
    assert loaded.config == head.config
    assert not loaded.training
    x = np.random.default_rng(1).standard_normal((7, 32)).astype(np.float32)
    np.testing.assert_array_equal(loaded.project(x), head.project(x))
    # Saving the loaded head again gives the same bytes.
    assert save_head(loaded, tmp_path / "h2") == checksum


def test_save_replaces_an_existing_head_and_leaves_no_temporaries(tmp_path: Path) -> None:
    save_head(_head(seed=0), tmp_path / "h")
    second = _head(seed=1)
    checksum = save_head(second, tmp_path / "h")
    assert head_checksum(tmp_path / "h") == checksum
    x = np.ones((1, 32), dtype=np.float32)
    np.testing.assert_array_equal(load_head(tmp_path / "h").project(x), second.project(x))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]


def test_load_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a condsearch head"):
        load_head(tmp_path / "nope")


def test_load_missing_weights(tmp_path: Path) -> None:
    save_head(_head(), tmp_path / "h")
    (tmp_path / "h" / WEIGHTS_FILE).unlink()
    with pytest.raises(ModelError, match="weights unreadable"):
        load_head(tmp_path / "h")


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b"\xff" * 8 + b[8:],  # header length garbage
        lambda b: b"",
    ],
    ids=["truncated", "bad-header", "empty"],
)
def test_load_corrupt_weights(tmp_path: Path, damage) -> None:
    save_head(_head(), tmp_path / "h")
    weights = tmp_path / "h" / WEIGHTS_FILE
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(ModelError, match="weights unreadable"):
        load_head(tmp_path / "h")


def test_load_weights_of_another_shape(tmp_path: Path) -> None:
    save_head(_head(), tmp_path / "h")
    save_head(_head(input_dim=16), tmp_path / "other")
    (tmp_path / "h" / WEIGHTS_FILE).write_bytes((tmp_path / "other" / WEIGHTS_FILE).read_bytes())
    with pytest.raises(ModelError, match="weights unreadable"):
        load_head(tmp_path / "h")


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format_version": 99, "input_dim": 32, "dim": 8})])
def test_load_bad_config(tmp_path: Path, text: str) -> None:
    save_head(_head(), tmp_path / "h")
    (tmp_path / "h" / CONFIG_FILE).write_text(text)
    with pytest.raises(ModelError):
        load_head(tmp_path / "h")


@pytest.mark.parametrize("folder", [LORA_PROFILE_DIR, FROZEN_HEAD_DIR])
def test_shipped_heads_load(folder: Path) -> None:
    head = load_head(folder)
    assert head.config.input_dim == 384
    assert head.config.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert head.project(np.zeros((1, 384), dtype=np.float32)).shape == (1, head.config.dim)
