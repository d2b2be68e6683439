"""OpenAI's Responses API: its blueprint, body, response objects, the chat request it runs as, and its typed event
stream."""
