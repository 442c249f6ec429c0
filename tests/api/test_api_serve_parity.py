"""The Python API answers exactly as `condsearch serve` does: one model policy for both (issue 40).

Both load an index's model through :func:`condsearch.model.policy.load_index_model`, so on the CPU both
run it on onnxruntime where the index allows it (CASE) and route on the router's export (csr).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

import condsearch
from condsearch.cli import main
from condsearch.query.hits import SCORE_PLACES
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import BackgroundServer, build_app
from tests.conftest import SENTENCES

COLOUR = "color of the dress"
QUERIES = [SENTENCES[2], SENTENCES[6], "a dog on a beach"]


@pytest.mark.parametrize("mode", ["case", "csr"])
def test_the_api_answers_exactly_as_the_server(
    mode: str, tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "indexes"
    flags = ["--head", "none"] if mode == "case" else ["--router", "none"]
    args = ["index", str(corpus_file), "-c", COLOUR, "--model", str(tiny_bert_dir), "--mode", mode, *flags]
    result = CliRunner().invoke(main, [*args, "--index-dir", str(folder)])
    assert result.exit_code == 0, result.output

    store = condsearch.open(folder, device="cpu")
    api = store.search(QUERIES, condition=COLOUR, k=4)
    config = ServeConfig(index_dir=folder, device="cpu")
    with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        body = http.post("/query", json={"queries": QUERIES, "condition": COLOUR, "k": 4}).json()
        served_models = http.get("/health").json()["models"]
    served = [[(h["id"], h["score"]) for h in a["results"]] for a in body["results"]]
    ours = [[(h.id, round(h.score, SCORE_PLACES)) for h in hits] for hits in api]
    assert ours == served  # the same rows and the same scores, to the places the server gives
    # and the same path ran the model: what the server reports is what the API loaded
    [loaded] = store._models.values()  # noqa: SLF001 - the store's one loaded model
    from condsearch.model.policy import backend_of

    assert [m["backend"] for m in served_models] == [backend_of(loaded)]
