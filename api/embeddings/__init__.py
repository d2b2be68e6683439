"""The embeddings endpoint: its blueprint, request body and response objects."""
