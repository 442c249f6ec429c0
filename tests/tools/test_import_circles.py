"""condsearch imports no module in a circle, type imports and imports inside functions included (issue 40)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools import import_graph

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["condsearch", "condsearch.serve", "condsearch.model.csr"])
@pytest.mark.parametrize("module_level", [True, False], ids=["module-level", "every-import"])
def test_no_circle_inside_the_package(package: str, module_level: bool) -> None:
    graph = import_graph.graph(module_level)
    inside = {m: {w for w in graph[m] if w.startswith(package)} for m in graph if m.startswith(package)}
    assert len(inside) > 5  # the package's modules were found
    assert import_graph.circles(inside) == []


def test_the_app_imports_the_embeddings_endpoint_plainly() -> None:
    # at the top, run at import time: neither under TYPE_CHECKING nor inside create_app, which only dodged the circle
    tree = ast.parse((ROOT / "condsearch" / "serve" / "app.py").read_text(encoding="utf-8"))
    plain = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert "condsearch.serve.embeddings" in plain
    nested = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "condsearch.serve.embeddings"]
    assert len(nested) == 1


def test_the_router_export_does_not_import_the_encoder() -> None:
    # onnx.py takes what it reads of the encoder as a Protocol; the encoder uses the export, not the reverse
    assert "condsearch.model.csr.encoder" not in import_graph.graph(module_level=False)["condsearch.model.csr.onnx"]
