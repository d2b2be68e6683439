"""Compiled attention kernels the engine calls: the CPU paged-decode kernel (C, built once per machine) and the Triton
paged decode and prefill kernels (CUDA; on CPU under Triton's interpreter, for tests)."""
