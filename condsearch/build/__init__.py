"""Building indexes: encoding a corpus under conditions, FAISS primitives, the approximate-index choice.

Holds encoding a corpus under conditions (ingest), FAISS index primitives and the
choice of an approximate index. Front door: :func:`condsearch.build.ingest.index_conditions`.
"""
