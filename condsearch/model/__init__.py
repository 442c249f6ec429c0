"""Which model answers an index, and how it runs.

Holds the vectorizer (encoder, head, prompts), the one-shot ONNX twin, the
torch-or-onnxruntime policy every front end shares, a model's identity and heads. The encoder spec
is :mod:`condsearch.encoders.spec`, model sources :mod:`condsearch.base.model_sources`. Front door: :func:`condsearch.model.policy.load_index_model`.
"""
