"""Published tables reproduced here: C-STS (CASE, CSR), WN18RR, conditional retrieval, latency."""
