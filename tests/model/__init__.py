"""Tests of condsearch.model: the model loader, vectorizers, heads and specs."""
