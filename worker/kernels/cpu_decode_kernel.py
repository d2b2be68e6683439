"""The CPU paged decode-attention kernel (paged_decode.c beside this file): built with the system C compiler once per
machine, cached, and called through ctypes.

On CPU, gathering every decode row's blocks and attending over the copy with batched matmuls cost most of a step's
attention: the gather writes all of the rows' K/V once more, and every length bucket pays a dozen operator calls
per layer. The kernel reads each row's blocks where they lie, once, for all decode rows in one call per layer
(docs/perf-notes.md). Without a compiler the engine keeps the gather path and says so in the log. A quantized pool's
codes (worker/kernels/kv_quant.py) are read and written by the same calls, given the layer's `KernelCodes`.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from pathlib import Path

import torch

from worker.kernels.c_library import CFLAGS, built_library
from worker.kernels.kernel_codes import KernelCodes, codes_scratch_floats
from worker.kernels.layer_variant import LayerVariant

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.c")
MAX_GROUP = 64  # query heads per KV head: paged_decode.c's MAX_GROUP, the size of a buffer on its stack
_POINTER, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
CODE_DTYPES = (torch.int8, torch.uint8)  # a quantized pool's elements


class CpuDecodeKernel:
    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))  # CDLL releases the GIL during each call
        self._attention = lib.paged_decode_attention
        self._attention.argtypes = [_POINTER] * 7 + [_INT] * 8 + [_FLOAT, _INT, _FLOAT, _POINTER, _POINTER]
        self._attention.restype = None
        self._write_keys = lib.paged_write_keys
        self._write_keys.argtypes = [_POINTER] * 3 + [_INT] * 5
        self._write_keys.restype = None
        self._decode_step = lib.paged_decode_step
        self._decode_step.argtypes = (
            [_POINTER, _INT, _INT] * 3 + [_POINTER] * 7 + [_INT] * 8 + [_FLOAT, _INT, _FLOAT, _POINTER, _POINTER]
        )
        self._decode_step.restype = None
        self._argmax = lib.greedy_argmax
        self._argmax.argtypes = [_POINTER, _INT, _INT, _POINTER]
        self._argmax.restype = None

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """[S] int64: `logits.argmax(dim=-1)` of float32 CPU logits [S, V], ties and NaN alike; torch's own runs
        one value at a time (measured 58-100 us for 32 rows of 2048, against 15)."""
        logits = logits.contiguous()
        _check_layouts(logits)
        rows, cols = logits.shape
        out = torch.empty(rows, dtype=torch.int64)
        if cols:
            self._argmax(logits.data_ptr(), rows, cols, out.data_ptr())
        return out

    def write_keys(self, k_cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
        """Stores `keys` [Hkv, N, D] (float32, contiguous) at `slots` [N] (int64) of one layer's keys
        [Hkv, num_blocks, D, block_size], transposed within blocks."""
        num_kv_heads, num_blocks, head_dim, block_size = k_cache.shape
        keys = keys.contiguous()  # held in a name: a temporary's memory could be freed before the call reads it
        _check_layouts(k_cache, keys, index=slots)  # the slots themselves are checked as the step is built
        args = (num_kv_heads, keys.shape[1], head_dim, num_blocks, block_size)
        self._write_keys(k_cache.data_ptr(), slots.data_ptr(), keys.data_ptr(), *args)

    def bind_decode_step(
        self,
        layers: list[tuple[torch.Tensor, torch.Tensor]],  # per layer: keys [Hkv, nb, D, bs] transposed in blocks,
        # values [Hkv, nb, bs, D], float32 and contiguous, as KVPool.layer gives them
        slots: torch.Tensor,  # [B] int64: each row's slot for its new K/V, inside the pool (checked as built)
        block_tables: torch.Tensor,  # [B, W] int64, contiguous: each row's blocks, padded
        context_lens: torch.Tensor,  # [B] int64: tokens each row attends to, its new one included
        max_len: int,
        codes: list[KernelCodes] | None = None,  # per layer, for a quantized pool (its layers then hold codes)
    ) -> DecodeStep:
        """A step whose every token is a decode row, bound once for all of its layers' calls."""
        for keys, values in layers:
            _check_pool(keys, values, is_coded=codes is not None)
        for index in (block_tables, context_lens, slots):
            _check_layouts(index=index)
        return DecodeStep(self._decode_step, layers, slots, block_tables, context_lens, max_len, codes)

    def attention(
        self,
        query: torch.Tensor,  # [B, H, D] float32, contiguous
        k_cache: torch.Tensor,  # [Hkv, num_blocks, D, block_size] float32, contiguous: keys transposed in blocks
        v_cache: torch.Tensor,  # [Hkv, num_blocks, block_size, D] float32, contiguous
        block_tables: torch.Tensor,  # [B, W] int64, contiguous: each row's blocks, padded
        context_lens: torch.Tensor,  # [B] int64: tokens each row attends to, at least 1, at most W * block_size
        max_len: int,  # the longest of context_lens
        variant: LayerVariant,
        codes: KernelCodes | None = None,  # the layer's, when the pool holds codes (int8 or uint8 then)
    ) -> torch.Tensor:
        """[B, H, D]: each row's one query token attended over its own context in the pool (its window of it)."""
        batch, num_heads, head_dim = query.shape
        num_kv_heads, num_blocks, block_size, _ = v_cache.shape
        _check_layouts(query, index=block_tables)
        _check_layouts(index=context_lens)
        _check_pool(k_cache, v_cache, is_coded=codes is not None)
        output = torch.empty(batch, num_heads, head_dim, dtype=torch.float32)
        scratch_size = _group_size(num_heads, num_kv_heads) * max_len
        if codes is not None:
            scratch_size += codes_scratch_floats(max_len, block_size, head_dim)
        scratch = torch.empty(scratch_size, dtype=torch.float32)
        sinks = _sinks(variant, num_heads)  # held in a name while the C code reads it
        self._attention(
            query.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            block_tables.data_ptr(),
            context_lens.data_ptr(),
            output.data_ptr(),
            scratch.data_ptr(),
            batch,
            num_heads,
            num_kv_heads,
            head_dim,
            num_blocks,
            block_size,
            block_tables.shape[1],
            max_len,
            *_variant_args(variant, sinks),
            None if codes is None else codes.pointer,
        )
        return output


class DecodeStep:
    """One step's decode rows bound to the kernel: per layer, one call stores each row's new key (transposed within
    its block) and value at its slot and attends, one pass per row, so the lines the stores bring in are the ones
    its attention reads next. What every layer shares (pool addresses, slots, tables, lengths) is read once here:
    a layer's call costs one ctypes call and its output, not the pool write's three calls and a query copy."""

    def __init__(
        self,
        function: ctypes._CFuncPtr,
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        max_len: int,
        codes: list[KernelCodes] | None,
    ) -> None:
        keys, _ = layers[0]
        self._function = function
        self._layer_addresses = [(keys.data_ptr(), values.data_ptr()) for keys, values in layers]
        self._tensors = (layers, slots, block_tables, context_lens)  # what the addresses point into, kept alive
        self._addresses = (slots.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr())
        self._batch, self._width = block_tables.shape
        self._num_kv_heads, self._num_blocks, self._head_dim, self._block_size = keys.shape
        self._max_len = max_len
        self._codes = codes
        self._codes_floats = 0 if codes is None else codes_scratch_floats(max_len, self._block_size, self._head_dim)
        self._scratch: torch.Tensor | None = None

    def __call__(
        self,
        layer_idx: int,
        query: torch.Tensor,  # [1, H, B, D] float32, D contiguous, any other strides: as the model hands it over
        key: torch.Tensor,  # [1, Hkv, B, D] float32, D contiguous: the rows' new keys
        value: torch.Tensor,  # [1, Hkv, B, D] float32, D contiguous
        variant: LayerVariant,
    ) -> torch.Tensor:
        """[B, H, D]: the layer's attention for every row, after storing the rows' K/V in the pool."""
        for tensor in (query, key, value):
            if tensor.dtype != torch.float32 or tensor.stride(-1) != 1 or tensor.device.type != "cpu":
                raise ValueError("the CPU decode kernel needs float32 CPU queries, keys and values, D contiguous")
        # The C code reads and writes through these sizes unchecked: anything else would touch memory it does not own.
        num_heads, batch, head_dim = query.shape[1], self._batch, self._head_dim
        kv_shape = (1, self._num_kv_heads, batch, head_dim)
        if query.shape != (1, num_heads, batch, head_dim) or key.shape != kv_shape or value.shape != kv_shape:
            raise ValueError("the CPU decode kernel got another shape than the step it was bound to")
        group = _group_size(num_heads, self._num_kv_heads)
        scratch_size = group * (self._max_len + head_dim) + self._codes_floats
        if self._scratch is None or self._scratch.numel() < scratch_size:
            self._scratch = torch.empty(scratch_size, dtype=torch.float32)
        output = torch.empty(batch, num_heads, head_dim, dtype=torch.float32)
        sinks = _sinks(variant, num_heads)  # held in a name while the C code reads it
        k_cache, v_cache = self._layer_addresses[layer_idx]
        self._function(
            query.data_ptr(),
            query.stride(2),
            query.stride(1),
            key.data_ptr(),
            key.stride(2),
            key.stride(1),
            value.data_ptr(),
            value.stride(2),
            value.stride(1),
            k_cache,
            v_cache,
            *self._addresses,
            output.data_ptr(),
            self._scratch.data_ptr(),
            batch,
            num_heads,
            self._num_kv_heads,
            head_dim,
            self._num_blocks,
            self._block_size,
            self._width,
            self._max_len,
            *_variant_args(variant, sinks),
            None if self._codes is None else self._codes[layer_idx].pointer,
        )
        return output


def _sinks(variant: LayerVariant, num_heads: int) -> torch.Tensor | None:
    """The variant's sinks as the C code reads them: [H] contiguous float32 on the CPU."""
    if variant.sinks is None:
        return None
    sinks = variant.sinks.detach().float().contiguous()
    if sinks.shape != (num_heads,) or sinks.device.type != "cpu":
        raise ValueError(f"the CPU decode kernel takes one sink per query head ({num_heads}) on the CPU")
    return sinks


def _variant_args(variant: LayerVariant, sinks: torch.Tensor | None) -> tuple[float, int, float, int | None]:
    """scale, window (0: none), softcap (0: none) and the sinks' address (NULL: none), as the C code takes them."""
    window, softcap = variant.sliding_window or 0, variant.softcap or 0.0
    return variant.scale, window, softcap, None if sinks is None else sinks.data_ptr()


def _group_size(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head, as the C code's stack buffer of MAX_GROUP holds them."""
    group, remainder = divmod(num_heads, num_kv_heads)
    if remainder or group > MAX_GROUP:
        raise ValueError(f"the CPU decode kernel takes a whole number of query heads per KV head, at most {MAX_GROUP}")
    return group


def _check_pool(keys: torch.Tensor, values: torch.Tensor, is_coded: bool) -> None:
    """A layer of the pool: float32, or one-byte codes when the kernel is given their scales."""
    if not is_coded:
        _check_layouts(keys, values)
        return
    for tensor in (keys, values):
        if tensor.dtype not in CODE_DTYPES or not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(
                f"the CPU decode kernel reads codes from contiguous int8 or uint8 CPU tensors: {tensor.dtype}"
            )


def _check_layouts(*floats: torch.Tensor, index: torch.Tensor | None = None) -> None:
    """What the C code assumes of the tensors it gets pointers to; a mismatch would read or write the wrong memory."""
    for tensor in floats:
        if tensor.dtype != torch.float32 or not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(f"the CPU decode kernel needs contiguous float32 CPU tensors, got {tensor.dtype}")
    if index is not None and (index.dtype != torch.int64 or not index.is_contiguous()):
        raise ValueError(f"the CPU decode kernel needs contiguous int64 indices, got {index.dtype}")


def load_cpu_decode_kernel(cache_dir: Path | None = None) -> CpuDecodeKernel | None:
    """The kernel, compiled on first use into `cache_dir` (default ~/.cache/steerbatch/kernels; see c_library.py);
    None, with a warning, when it cannot be built."""
    try:
        return CpuDecodeKernel(built_library(SOURCE, CFLAGS, cache_dir))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("CPU decode kernel unavailable (%s): decode attention gathers blocks instead", exc)
        return None
