"""Embeddings: a packed forward over whole inputs without the KV pool, pooled per input and L2-normalised."""
