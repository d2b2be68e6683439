"""JSON-safe dataclasses that cross process boundaries: generate requests, results and stream events, grammars,
steering, tool calls."""
