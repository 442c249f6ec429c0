"""What the benchmark scripts share: provenance and output files, features, isotropy, helpers, kgclib."""
