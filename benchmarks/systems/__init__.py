"""Speed, size and serving: encode and index throughput, ANN, int8, serve, scale, the router's paths."""
