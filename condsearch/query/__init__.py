"""Answering a query: search, hits and their JSON, calibration, builds on demand, the loaded-index cache.

Holds search over an index, hits and their JSON, calibration, indexes built on demand, opening a
store by its location (``sources``) and the loaded-model-and-index cache. Front door:
:func:`condsearch.query.search.answer`.
"""
