"""Tests of condsearch.query: answering queries, one-shot and resident, and conditions on demand."""
