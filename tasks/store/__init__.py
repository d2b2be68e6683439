"""The SQL store: engine and sessions, request, result and response rows, API keys, and the one way a request ends."""
