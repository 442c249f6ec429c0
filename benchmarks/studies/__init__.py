"""Our own studies: fine-tuning, low rank, WiSE-FT, blends and mixtures, out of domain, any text."""
