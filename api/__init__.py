"""The Flask API: validates, records in SQL, enqueues on Redis, relays streams as SSE. Never imports torch."""
