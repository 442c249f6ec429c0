"""`condsearch query --json` answers a CASE index exactly as `condsearch serve` does, on every CPU kind (issue 58, 11b).

`serve --help` promises it. On a bfloat16 CPU a CASE ``--profile none`` index was answered with the
same ids but scores up to 0.0024 apart: the one-shot query ran torch in ``--dtype auto``'s bfloat16
until its first answer had written the float32 export and onnxruntime after, and more than a few
queries always took torch, while the server ran the CPU kind's serving path (onnxruntime float32 on
AVX-512 BF16, torch bfloat16 on AMX). A query now loads a CASE index's model as the server does
(:func:`condsearch.model.policy.load_index_model`). The kind is forced with ``CONDSEARCH_CPU_KIND``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from condsearch.base.cpu_kind import CPU_KIND_ENV, CPU_KINDS
from condsearch.cli import main
from condsearch.query.hits import SCORE_PLACES
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import BackgroundServer, build_app
from tests.conftest import SENTENCES

COLOUR = "color of the dress"
FEW = [SENTENCES[2], "a dog on a beach"]
MANY = [f"{s} number {i}" for i, s in enumerate(SENTENCES * 3)]  # more than a one-shot query's few


def _cli(folder: Path, queries: list[str]) -> list[list[tuple[str, float]]]:
    result = CliRunner().invoke(
        main, ["query", *queries, "-c", COLOUR, "-k", "4", "--json", "--index-dir", str(folder)]
    )
    assert result.exit_code == 0, result.output
    return [[(h["id"], h["score"]) for h in json.loads(line)["results"]] for line in result.stdout.splitlines()]


def _served(folder: Path, queries: list[str]) -> list[list[tuple[str, float]]]:
    config = ServeConfig(index_dir=folder, device="cpu")
    with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        body = http.post("/query", json={"queries": queries, "condition": COLOUR, "k": 4}).json()
    return [[(h["id"], h["score"]) for h in a["results"]] for a in body["results"]]


def _same(ours: list[list[tuple[str, float]]], served: list[list[tuple[str, float]]]) -> None:
    assert [[i for i, _ in q] for q in ours] == [[i for i, _ in q] for q in served]
    gap = max(abs(a - b) for q, r in zip(ours, served, strict=True) for (_, a), (_, b) in zip(q, r, strict=True))
    assert gap <= 1.5 * 10**-SCORE_PLACES, gap  # the same scores to the places both give (a rounding apart at most)


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_query_json_answers_a_case_index_as_serve_does(
    kind: str, tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_KIND_ENV, kind)
    folder = tmp_path / "indexes"
    args = ["index", str(corpus_file), "-c", COLOUR, "--model", str(tiny_bert_dir), "--mode", "case", "--head", "none"]
    result = CliRunner().invoke(main, [*args, "--index-dir", str(folder)])
    assert result.exit_code == 0, result.output
    first = _cli(folder, FEW)  # on a bfloat16 kind, no float32 export is cached yet: the build ran torch
    again = _cli(folder, FEW)  # the first query's export is cached by now
    many = _cli(folder, MANY)
    _same(first, _served(folder, FEW))
    _same(again, _served(folder, FEW))
    _same(many, _served(folder, MANY))
