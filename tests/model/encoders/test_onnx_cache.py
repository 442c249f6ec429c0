"""The ONNX backend's shared parts: cache folder names kept across versions, runs of like length, the probe's scale."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.base.model_sources import ModelSource
from condsearch.model.csr.keys import RouterIdentity
from condsearch.model.encoders.onnx.bert import export_folder
from condsearch.model.encoders.onnx.rounding import largest_activation
from condsearch.model.encoders.onnx.run import runs

VERSIONS = {"onnxruntime": "1.20.0", "onnx": "1.17.0", "torch": "2.13.0"}


def test_cache_folders_keep_the_names_earlier_versions_gave_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # computed by the code before the one ONNX backend (issue 60, item 3): caches written then are found
    monkeypatch.setattr(importlib.metadata, "version", lambda name: VERSIONS[name])
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(tmp_path))
    source = ModelSource("org/model", "org/model", "rev123", False)
    case = export_folder(source, None, "float32")
    assert case is not None and case.parent == tmp_path / "onnx" and case.name == "0183d9a600d350cbabfae810"
    assert getattr(export_folder(source, None, "int8"), "name", None) == "cb4683cb363dfc2f3300490b"
    config = {"k": 2, "variant": "context"}
    identity = RouterIdentity("org/model", "rev123", 4, 128, "context", config, "w" * 8)
    assert getattr(identity.export_folder(tmp_path, "float32"), "name", None) == "1e3fa3387eb8579f0c62e8f9"
    assert getattr(identity.export_folder(tmp_path, "int8", w_scale=0.5), "name", None) == "efacad337e55c1c08febd729"
    assert export_folder(ModelSource("org/model", "org/model", "main", False), None, "float32") is None


def test_runs_are_of_like_length_each_cut_to_its_longest_row() -> None:
    lengths = np.array([3, 9, 5, 9, 1, 0])
    assert [(list(rows), width) for rows, width in runs(lengths, 2)] == [([1, 3], 9), ([2, 0], 5), ([4, 5], 1)]
    assert [(list(rows), width) for rows, width in runs(lengths, 0)] == [([1, 3, 2, 0, 4, 5], 9)]  # 0: one run
    assert list(runs(np.array([], dtype=int), 0)) == []


def test_the_largest_activation_counts_layers_run_one_by_one() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[3.0, 0.0], [0.0, -7.0]]))
        model[0].bias.zero_()
    x = torch.tensor([[1.0, 1.0]])
    with largest_activation(model) as found:
        model(x)  # a whole pass: one number
    assert found == [7.0]
    with largest_activation(model) as found:
        model[0](x)  # a layer alone, as the router's passes run them: counted on leaving
        assert found == []
    assert found == [7.0]
