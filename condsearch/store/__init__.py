"""Where indexes live: the folder store, manifests, kept vectors and atomic writes.

Holds the folder store and its FAISS adapter, manifests (with their field checks),
kept vectors, atomic writes and file digests. Front door: :func:`condsearch.store.sources.open_source`.
"""
