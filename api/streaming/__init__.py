"""Server-Sent Events, the stream hub that reads every relayed Redis stream, and whether a client is still there."""
