"""Tests of The Python API (condsearch.api): what load_model, index and query give a caller."""
