"""The contract between api and worker: config, Celery app, messages, SQL store, Redis streams."""
