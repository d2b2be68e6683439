"""The GPU worker: `app` is its Celery entry; `engine/` runs the model, `serving/` is the Celery side around it."""
