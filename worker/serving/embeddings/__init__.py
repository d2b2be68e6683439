"""The Celery side of embeddings: the embeddings task handler, and the lines of an embeddings batch."""
