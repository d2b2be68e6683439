"""OpenAI's Conversations API: conversations, their items, and the turns responses add to them."""
