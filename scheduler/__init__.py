"""Continuous-batching bookkeeping (pure Python, no torch): arrives with the continuous-batching engine."""
