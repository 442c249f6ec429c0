"""Tests of condsearch.model.artifacts: the files a model, head or router is made of, checked before use."""
