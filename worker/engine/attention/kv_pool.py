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
from worker.kernels.kernel_codes import KernelCodes
from worker.kernels.kv_quant import FP8_DEFAULT_SCALE, KVCacheDtype, dequantize, quantize_fp8, quantize_int8

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

    def bytes_per_token(self, dtype: torch.dtype, kv_dtype: KVCacheDtype = KVCacheDtype.AUTO) -> int:
        """K and V of one token in every layer, in a pool of `dtype`'s elements or `kv_dtype`'s codes and scales."""
        element = kv_dtype.storage_dtype(dtype).itemsize
        per_head = self.head_dim * element + kv_dtype.scale_bytes_per_head()
        return 2 * self.num_layers * self.num_kv_heads * per_head


class KVPool:
    """K and V of every layer, allocated once. Slot = block * block_size + offset within the block.

    Two layouts, one per attention backend: flash-attn's paged kernels read [num_blocks, block_size, Hkv, D];
    our SDPA path reads [Hkv, num_blocks, block_size, D], so that gathering a row's blocks yields each KV head's
    context contiguously and attention runs as plain batched matmuls without a copy. With the CPU decode kernel,
    keys are stored [Hkv, num_blocks, D, block_size], transposed within each block: the kernel then scores a
    block's tokens against a query as one vector per head dimension, with no sum across vector lanes.

    With a quantized `kv_dtype` (worker/kernels/kv_quant.py) the same layouts hold one-byte codes, and `scales` their
    scales: [layers, 2 (K, V), Hkv, slots] for int8, [layers, 2] for fp8. Tokens are quantized as they are written
    and every backend turns only the blocks it reads back into the model's dtype."""

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
        kv_dtype: KVCacheDtype = KVCacheDtype.AUTO,
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
        self.dtype = dtype  # of the K/V the model hands over and gets back
        self.kv_dtype = kv_dtype
        self.layer_windows = shape.layer_windows or (None,) * shape.num_layers
        self.windows = frozenset(self.layer_windows)  # the gathering path's step metadata is built once for each
        self.decode_kernel = decode_kernel if is_heads_major else None  # reads decode rows' blocks in place
        heads, dim, blocks = shape.num_kv_heads, shape.head_dim, self._num_allocated_blocks
        per_layer = (heads, blocks, block_size, dim) if is_heads_major else (blocks, block_size, heads, dim)
        storage = kv_dtype.storage_dtype(dtype)
        self.cache = torch.zeros(shape.num_layers, 2, *per_layer, dtype=storage, device=device)
        self.scales = _allocate_scales(kv_dtype, shape.num_layers, heads, blocks * block_size, device)
        self.layers = [self._layer_view(layer_idx) for layer_idx in range(shape.num_layers)]  # made once
        self.kernel_codes: list[KernelCodes] | None = None  # per layer, how the C kernel reads a quantized pool
        if self.decode_kernel is not None and kv_dtype.is_quantized:
            self.kernel_codes = [KernelCodes(kv_dtype, *self.layer_scales(i)) for i in range(shape.num_layers)]

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

    def layer_scales(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V scales, each [Hkv, slots] float32 (a view of the layer's one scale for fp8, strides 0);
        only for a quantized pool."""
        if self.kv_dtype is KVCacheDtype.INT8:
            return self.scales[layer_idx, 0], self.scales[layer_idx, 1]
        shape = (self.num_kv_heads, self._num_allocated_blocks * self.block_size)
        return self.scales[layer_idx, 0].expand(shape), self.scales[layer_idx, 1].expand(shape)

    def dequantized(
        self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, block_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes gathered from the blocks `block_ids` ([Hkv, len(block_ids) * block_size, D] each) as K and V in the
        model's dtype; a float pool's as they are."""
        if not self.kv_dtype.is_quantized:
            return keys, values
        if self.kv_dtype is KVCacheDtype.INT8:  # [2, Hkv, L]: the gathered tokens' own scales
            scales = self.scales[layer_idx].view(2, self.num_kv_heads, -1, self.block_size)
            scales = scales.index_select(2, block_ids).flatten(2, 3)
        else:
            scales = self.scales[layer_idx].view(2, 1, 1)
        kind, dtype = self.kv_dtype, self.dtype
        return dequantize(keys, scales[0], kind, dtype), dequantize(values, scales[1], kind, dtype)

    def _layer_view(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache[layer_idx, 0], self.cache[layer_idx, 1]
        if self.keys_transposed:
            keys = keys.view(self.num_kv_heads, self._num_allocated_blocks, self.head_dim, self.block_size)
        return keys, values

    def write(self, layer_idx: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Stores the new tokens' K and V ([Hkv, N, D] each) at `slots` [N], as codes in a quantized pool."""
        keys, values = self.layer(layer_idx)
        if self.kv_dtype.is_quantized:
            key, value = self._quantized(layer_idx, slots, key, value)
            if self.keys_transposed:  # [Hkv, nb, D, bs]: codes have no C store, so indexed in place
                keys[:, slots // self.block_size, :, slots % self.block_size] = key.transpose(0, 1)
                values.view(self.num_kv_heads, -1, self.head_dim).index_copy_(1, slots, value)
                return
        if not self.is_heads_major:
            for cache, new in ((keys, key), (values, value)):
                cache.view(-1, *cache.shape[-2:]).index_copy_(0, slots, new.transpose(0, 1))
            return
        if self.decode_kernel is not None:
            self.decode_kernel.write_keys(keys, slots, key)
        else:
            keys.view(self.num_kv_heads, -1, self.head_dim).index_copy_(1, slots, key)
        values.view(self.num_kv_heads, -1, self.head_dim).index_copy_(1, slots, value)

    def _quantized(
        self, layer_idx: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The new tokens' K and V ([Hkv, N, D]) as codes; int8's per-token scales are stored at their slots."""
        if self.kv_dtype is KVCacheDtype.FP8_E4M3:
            return quantize_fp8(key, self.scales[layer_idx, 0]), quantize_fp8(value, self.scales[layer_idx, 1])
        (key, key_scales), (value, value_scales) = quantize_int8(key), quantize_int8(value)
        self.scales[layer_idx, 0].index_copy_(1, slots, key_scales)
        self.scales[layer_idx, 1].index_copy_(1, slots, value_scales)
        return key, value

    @property
    def num_bytes(self) -> int:
        return self.cache.numel() * self.cache.element_size() + self.scales.numel() * self.scales.element_size()

    @property
    def num_tokens(self) -> int:
        """Token slots requests may hold."""
        return self.num_blocks * self.block_size


def _allocate_scales(
    kv_dtype: KVCacheDtype, num_layers: int, num_kv_heads: int, num_slots: int, device: torch.device
) -> torch.Tensor:
    """int8: one scale per token per KV head, K's and V's; fp8: one per layer for each (fixed); none unquantized."""
    if kv_dtype is KVCacheDtype.INT8:
        return torch.ones(num_layers, 2, num_kv_heads, num_slots, dtype=torch.float32, device=device)
    num_scales = (num_layers, 2) if kv_dtype is KVCacheDtype.FP8_E4M3 else (0, 2)
    return torch.full(num_scales, FP8_DEFAULT_SCALE, dtype=torch.float32, device=device)


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
