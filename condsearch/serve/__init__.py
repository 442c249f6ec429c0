"""`condsearch serve`: an HTTP JSON query server that loads each model once and keeps indexes resident,
with a search page at ``/`` (``page``, the files in ``static/``).

Importing this package is cheap; FastAPI, uvicorn, torch and FAISS load only in the modules that
need them (``app``, ``page``, ``server``, ``engine``).
"""
