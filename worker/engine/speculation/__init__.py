"""Speculative decoding inside the engine step: proposers (prompt lookup, self-draft, draft model), when they pay,
and verification."""
