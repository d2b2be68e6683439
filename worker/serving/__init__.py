"""The Celery side of a worker: task handlers for chat and batch chunks, the output processor, flag watchers, the
lease, steering sync."""
