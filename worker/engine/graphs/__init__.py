"""Decode steps as CUDA graphs: batch-size buckets, static padded buffers, steering hooks as graph inputs."""
