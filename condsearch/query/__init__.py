"""Answering a query: search, hits and their JSON, calibration, conditions, the loaded-index cache.

Holds search over an index, hits and their JSON, calibration, conditions (their
limits, built on demand), and the loaded-model-and-index cache. Front door:
:func:`condsearch.query.search.answer`.
"""
