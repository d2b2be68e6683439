"""Each step's tokens from its logits: the sampler, the verification of proposed tokens, prompt logprobs, and the
one read-back of a step's results from the device."""
