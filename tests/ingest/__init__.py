"""Tests of condsearch.ingest: indexing a corpus under a condition."""
