"""Steering profiles, the worker-wide monitor and the SAE listing: blueprints, body schemas, and the checks against the
SAEs."""
