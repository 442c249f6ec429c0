"""A re-run of `condsearch index` tells what it encoded (issue 59): a second `make demo` said "63 pairs/s" for 0
rows encoded. Nothing encoded: no rate, one line saying so; some rows encoded: the rate of those."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from condsearch.cli import main
from tests.conftest import SENTENCES, WriteCorpus

COLOUR, SPORT = "color of the dress", "the sport being played"


def index(corpus: Path, folder: Path, model: Path) -> str:
    args = ["index", str(corpus), "-c", COLOUR, "-c", SPORT, "--model", str(model), "--head", "none"]
    result = CliRunner().invoke(main, [*args, "--backend", "torch", "--index-dir", str(folder)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result.stderr.splitlines()[-1]


def test_a_re_run_that_encodes_nothing_reports_no_rate(
    tiny_bert_dir: Path, write_corpus: WriteCorpus, tmp_path: Path
) -> None:
    ids = [f"s{i}" for i in range(len(SENTENCES))]
    corpus = write_corpus({"id": ids, "text": list(SENTENCES)})
    folder = tmp_path / "ix"
    first = index(corpus, folder, tiny_bert_dir)
    assert "pairs/s" in first and "encoded on torch" in first  # a first build's rate stays
    again = index(corpus, folder, tiny_bert_dir)
    n = len(SENTENCES)
    said = rf"condsearch: nothing to encode: all {n} rows already indexed under 2 conditions \(\d+\.\ds\)"
    assert re.fullmatch(said, again), again
    assert "pairs/s" not in again
    changed = write_corpus({"id": ids, "text": ["A dog in a red coat.", *SENTENCES[1:]]})
    partly = index(changed, folder, tiny_bert_dir)
    # one row under two conditions encoded: the rate is of those two pairs, the rest kept
    assert f"{2 * n} pairs in" in partly and ": 2 encoded on torch" in partly and "pairs/s)" in partly
    assert f"{2 * n - 2} kept from the last index" in partly
