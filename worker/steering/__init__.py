"""The engine's side of steering and monitoring: the SAEs a model can use, each request's resolved deltas, one
step's hook plan, the worker-wide monitor."""
