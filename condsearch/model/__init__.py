"""Which model answers an index, and how it runs.

Holds the encoder spec, the vectorizer (encoder, head,
prompts), the one-shot ONNX twin, the torch-or-onnxruntime policy every front end shares, model
sources and heads. Front door: :func:`condsearch.model.policy.load_index_model`.
"""
