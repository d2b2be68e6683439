"""What every request passes before its view: admission slots and queue room, API keys, body and size limits,
idempotency keys, request ids."""
