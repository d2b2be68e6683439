"""The engine in a process of its own: the Celery worker's threads (intake, claims, results, the output processor)
and the engine thread no longer share one GIL (docs/ARCHITECTURE.md says why)."""
