"""`condsearch serve`: an HTTP JSON query server that loads each model once and keeps indexes resident.

Importing this package is cheap; FastAPI, uvicorn, torch and FAISS load only in the modules that
need them (``app``, ``server``, ``engine``).
"""
