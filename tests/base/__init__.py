"""Tests of condsearch.base: files, digests, atomic writes, FAISS primitives and other bottom-layer helpers."""
