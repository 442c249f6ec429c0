"""Tests of condsearch.store: the index store, its listing, lifecycle and refusals."""
