"""Attention over the paged KV pool: the pool itself, one step's tensors, the backends (SDPA, the CPU
kernel, Triton, flash-attn) and which one runs."""
