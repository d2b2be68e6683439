"""Constrained decoding: grammars compiled off the engine thread (xgrammar), one matcher per constrained row, and
the token bitmasks the sampler applies to those rows' logits."""
