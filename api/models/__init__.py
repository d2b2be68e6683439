"""The served models: each one's tokenizer and limits, loaded once, and GET /v1/models."""
