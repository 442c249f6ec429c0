"""Tests of condsearch.corpus: reading corpus tables and C-STS files."""
