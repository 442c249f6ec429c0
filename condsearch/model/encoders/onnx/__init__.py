"""The one ONNX backend: exports cached, checked against torch and run by onnxruntime, for CASE and the router.

Each model family gives only its graphs and their glue: CASE's encoder is ``bert``
(:class:`~condsearch.model.encoders.onnx.bert.OnnxBertEncoder`, ``--quantize int8``), the router's two
passes are :mod:`condsearch.model.csr.onnx` and :mod:`condsearch.model.csr.onnx_run`. The rest is shared:
``cache`` (where an export is cached, its meta file, the checks of its files, publishing one),
``run`` (onnxruntime sessions, the export's tokenizer, runs of like length), both without torch, so
that a one-shot query reads an export with onnxruntime, ``tokenizers`` and numpy alone; ``export``
(writing one through torch: tracing, int8 quantisation, the meta file, the check against torch on
a probe, the atomic move into the cache), ``trace`` (BERT in plain torch, what is traced) and
``rounding`` (how far two correct float runs may differ: the probe's bound, and the tests').
Its modules are imported one by one, from inside condsearch only; this file imports nothing.
"""
