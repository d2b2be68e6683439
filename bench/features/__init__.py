"""What each engine feature costs or saves, in one process: the prefix cache, sliding-window KV blocks, speculative
decoding, steering, structured outputs."""
