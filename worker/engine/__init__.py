"""The continuous-batching engine: the loop, step building, the model runner, paged attention over the KV pool,
the sampler. No Celery, no Redis."""
