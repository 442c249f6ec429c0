"""Where indexes live: the folder store, manifests, kept vectors, condition names and score backgrounds.

Holds the folder store and its FAISS adapter, manifests (with their field checks), kept vectors,
conditions in their normal form (``conditions``) and the score background recorded with an index
(``background``). Atomic writes and file digests are :mod:`condsearch.base`'s. Front door:
:class:`condsearch.store.folder.IndexStore` (a folder or Milvus: :func:`condsearch.query.sources.open_source`).
"""
