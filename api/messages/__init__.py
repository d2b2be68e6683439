"""Anthropic's Messages API: its blueprint, request bodies, the chat request a message runs as, its objects and
stream events."""
