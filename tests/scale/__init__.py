"""Tests of condsearch.scale: Ray and Milvus."""
