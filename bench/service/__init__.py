"""Benchmarks through a stack of real processes (api, Redis, SQL, worker): Batch API throughput and validation,
chat latency beside a batch, the api under many open streams, streamed completions against the engine in process."""
