"""The GPU worker: Celery entry, the engine thread, the model runner and the sampler."""
