"""The Batch API and its files: blueprints, batch and file objects, input-line validation, progress relay, expiry,
pages."""
