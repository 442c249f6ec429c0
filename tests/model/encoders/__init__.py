"""Tests of condsearch.model.encoders: encoder families, their CPU and ONNX runners, tokenizers."""
