"""The engines the benchmarks compare, each fed the same workload and timed the same way: HF `generate` (one at a
time, static batches), HF's continuous batching, and steerbatch's engine."""
