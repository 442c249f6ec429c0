"""Tests of condsearch.model.csr: the router (CSR tri-encoder), its caches and its ONNX path."""
