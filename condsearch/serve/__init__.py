"""`condsearch serve`: an HTTP JSON query server with resident models and indexes, and a search page.

It loads each model once, keeps indexes resident (from a folder or Milvus), batches queries that
arrive together, limits what a request may cost and serves a search page at ``/`` (``page``, the
files in ``static/``: HTML, JavaScript, CSS).

Importing this package is cheap; FastAPI, uvicorn, torch and FAISS load only in the modules that
need them (``app``, ``page``, ``server``); the resident indexes and models are
:class:`condsearch.query.resident.Resident`.
"""
