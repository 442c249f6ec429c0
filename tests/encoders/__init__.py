"""Tests of condsearch.encoders: encoder families, their CPU and ONNX runners, tokenizers."""
