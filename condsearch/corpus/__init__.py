"""Reading texts: corpus files checked before parsing, texts in memory, the demo corpus, C-STS files.

Holds corpus files (parquet, CSV, JSON lines) checked before they are parsed, texts
held in memory, the demo corpus and C-STS files. Front door: the names below (:func:`read_corpus`
and :func:`scan_corpus` first), each loaded on first use, so that importing this package loads
neither pyarrow nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.corpus.csts import LABEL_MAX, LABEL_MIN
    from condsearch.corpus.demo import write_demo_corpus
    from condsearch.corpus.formats import FORMATS, CorpusConfig
    from condsearch.corpus.memory import check_utf8, is_table, memory_corpus
    from condsearch.corpus.reader import CorpusFile, read_corpus, scan_corpus

__all__ = [
    "FORMATS",
    "LABEL_MAX",
    "LABEL_MIN",
    "CorpusConfig",
    "CorpusFile",
    "check_utf8",
    "is_table",
    "memory_corpus",
    "read_corpus",
    "scan_corpus",
    "write_demo_corpus",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "FORMATS": "formats",
    "LABEL_MAX": "csts",
    "LABEL_MIN": "csts",
    "CorpusConfig": "formats",
    "CorpusFile": "reader",
    "check_utf8": "memory",
    "is_table": "memory",
    "memory_corpus": "memory",
    "read_corpus": "reader",
    "scan_corpus": "reader",
    "write_demo_corpus": "demo",
}


__getattr__ = lazy_names(__name__, _HOMES)
