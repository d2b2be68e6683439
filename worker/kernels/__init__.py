"""Compiled attention kernels the engine calls: the CPU paged-decode kernel (C, built once per machine)."""
