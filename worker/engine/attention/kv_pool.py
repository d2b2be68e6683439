"""The static KV cache: one tensor per model, allocated once, carved into fixed-size blocks of token slots."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PretrainedConfig

from tasks.config import Config
from worker.engine.attention.layer_attention import layer_windows

if TYPE_CHECKING:
    from worker.kernels.cpu_decode_kernel import CpuDecodeKernel

logger = logging.getLogger(__name__)
CPU_MEMORY_FRACTION = 0.25  # of available RAM, the most an automatic CPU pool may take


@dataclass(frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int | None, ...] | None = None  # each layer's sliding window; None: no layer slides

    @classmethod
    def of(cls, model_config: PretrainedConfig) -> KVShape:
        num_heads = model_config.num_attention_heads
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // num_heads
        num_kv_heads = getattr(model_config, "num_key_value_heads", None) or num_heads
        return cls(model_config.num_hidden_layers, num_kv_heads, head_dim, layer_windows(model_config))

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize


class KVPool:
    """K and V of every layer, allocated once. Slot = block * block_size + offset within the block.

    Two layouts, one per attention backend: flash-attn's paged kernels read [num_blocks, block_size, Hkv, D];
    our SDPA path reads [Hkv, num_blocks, block_size, D], so that gathering a row's blocks yields each KV head's
    context contiguously and attention runs as plain batched matmuls without a copy. With the CPU decode kernel,
    keys are stored [Hkv, num_blocks, D, block_size], transposed within each block: the kernel then scores a
    block's tokens against a query as one vector per head dimension, with no sum across vector lanes."""

    def __init__(
        self,
        shape: KVShape,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        is_heads_major: bool = True,
        decode_kernel: CpuDecodeKernel | None = None,
        has_scratch_block: bool = False,
    ) -> None:
        self.num_blocks = num_blocks  # the blocks requests may hold
        # One more block past them that no request ever holds: the padding rows of a CUDA graph's decode step write
        # their K/V there and attend only to it (worker/engine/graphs/decode_buffers.py).
        self.scratch_block = num_blocks if has_scratch_block else None
        self._num_allocated_blocks = num_blocks + int(has_scratch_block)
        self.block_size = block_size
        self.is_heads_major = is_heads_major
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.dtype = dtype
        self.layer_windows = shape.layer_windows or (None,) * shape.num_layers
        self.windows = frozenset(self.layer_windows)  # the gathering path's step metadata is built once for each
        self.decode_kernel = decode_kernel if is_heads_major else None  # reads decode rows' blocks in place
        heads, dim, blocks = shape.num_kv_heads, shape.head_dim, self._num_allocated_blocks
        per_layer = (heads, blocks, block_size, dim) if is_heads_major else (blocks, block_size, heads, dim)
        self.cache = torch.zeros(shape.num_layers, 2, *per_layer, dtype=dtype, device=device)
        self.layers = [self._layer_view(layer_idx) for layer_idx in range(shape.num_layers)]  # made once

    @property
    def keys_transposed(self) -> bool:
        """Keys are stored [Hkv, num_blocks, D, block_size], as the CPU decode kernel reads them."""
        return self.decode_kernel is not None

    def check_window(self, layer_idx: int, window: int | None) -> None:
        """Refuses a call whose sliding window is not the one read from the config for its layer: the step metadata
        and the blocks kept for the layer assume that one."""
        expected = self.layer_windows[layer_idx]
        if window != expected:
            raise ValueError(f"layer {layer_idx} attends with sliding window {window}; its config says {expected}")

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, each in the pool's layout."""
        return self.layers[layer_idx]

    def _layer_view(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache[layer_idx, 0], self.cache[layer_idx, 1]
        if self.keys_transposed:
            keys = keys.view(self.num_kv_heads, self._num_allocated_blocks, self.head_dim, self.block_size)
        return keys, values

    def write(self, layer_idx: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Stores the new tokens' K and V ([Hkv, N, D] each) at `slots` [N]."""
        keys, values = self.layer(layer_idx)
        if not self.is_heads_major:
            for cache, new in ((keys, key), (values, value)):
                cache.view(-1, *cache.shape[-2:]).index_copy_(0, slots, new.transpose(0, 1))
            return
        if self.decode_kernel is not None:
            self.decode_kernel.write_keys(keys, slots, key)
        else:
            keys.view(self.num_kv_heads, -1, self.head_dim).index_copy_(1, slots, key)
        values.view(self.num_kv_heads, -1, self.head_dim).index_copy_(1, slots, value)

    @property
    def num_bytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()


def every_layer_window(pool: KVPool) -> int | None:
    """The widest sliding window when every layer of the pool's model slides (a request's blocks before it are then
    seen by no later query); None when some layer attends to all earlier tokens."""
    return None if None in pool.windows else max(pool.windows)


def num_pool_tokens(config: Config, bytes_per_token: int, device: torch.device, max_model_len: int) -> int:
    """KV_CACHE_TOKENS when set; else a fraction of free CUDA memory, or enough for every sequence at full length
    on CPU (capped by a share of available RAM)."""
    if config.kv_cache_tokens > 0:
        return config.kv_cache_tokens
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        return int(free_bytes * config.kv_cache_memory_fraction) // bytes_per_token
    wanted = config.max_num_seqs * max_model_len
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(wanted, int(available * CPU_MEMORY_FRACTION) // bytes_per_token)
