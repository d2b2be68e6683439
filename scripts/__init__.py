"""Operator scripts: build the tiny model, run the stack, run the demo."""
