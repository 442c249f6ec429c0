"""condsearch's benchmarks, run from the repository root as modules: ``python -m benchmarks.paper.csts --help``.

Groups: ``paper`` (published tables), ``systems`` (speed, size, serving), ``studies`` (ours: fine-tuning,
mixtures, out of domain, any text); ``_lib`` is what they share. See benchmarks/README.md.
"""
