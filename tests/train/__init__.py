"""Tests of condsearch.train: training and adapting (heads, LoRA, whole models, routers, pairs)."""
