"""Continuous-batching bookkeeping, pure Python (no torch): requests, the scheduler, the KV block pool."""
