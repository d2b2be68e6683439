"""Command-line tools for a running service: API keys, the Batch API client, a live terminal view."""
