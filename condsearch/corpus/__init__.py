"""Reading texts: corpus files checked before parsing, texts in memory, the demo corpus, C-STS files.

Holds corpus files (parquet, CSV, JSON lines) checked before they are parsed, texts
held in memory, the demo corpus and C-STS files. Front door: :func:`condsearch.corpus.reader.read_corpus`.
"""
