"""The paged KV cache: a block allocator (:class:`BlockTable`) and a ``transformers.Cache`` on top of it.

Fixed-size blocks, a block table per sequence and a free list; appending allocates blocks, rollback
frees every block wholly past the new length and keeps the accepted pages.  The pool grows (at least
doubling) when a write finds the free list short, up to an optional ``max_blocks``; an allocation that
fails is one clear error.  :mod:`specdec_lesson.kvcache` re-exports both classes.
"""

from __future__ import annotations

import math
import os

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["BlockTable", "PagedKVCache", "check_pool_fits"]


class BlockTable:
    """Block allocator shared by all layers: a free list and one block table per sequence."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def blocks_for(self, length: int) -> int:
        return -(-length // self.block_size)

    def reserve(self, seq: int, new_length: int) -> None:
        """Make sequence ``seq`` hold ``new_length`` tokens, allocating blocks as needed."""
        table = self.tables.get(seq, [])
        need = self.blocks_for(new_length) - len(table)
        if need > len(self.free):  # checked before registering seq: a failed call changes nothing
            raise RuntimeError(f"paged KV cache out of blocks: need {need}, {len(self.free)} free of {self.num_blocks}")
        self.tables[seq] = table
        for _ in range(max(need, 0)):
            table.append(self.free.pop())
        self.lengths[seq] = max(self.lengths.get(seq, 0), new_length)

    def grow(self, extra: int) -> None:
        """Add ``extra`` free blocks (ids ``num_blocks..``); the pools the table indexes must grow with it."""
        old = self.num_blocks
        self.num_blocks += extra
        self.free[:0] = range(self.num_blocks - 1, old - 1, -1)  # handed out after the blocks free now

    def truncate(self, seq: int, new_length: int) -> list[int]:
        """Roll ``seq`` back to ``new_length`` tokens; frees (and returns) blocks wholly past it."""
        length = self.lengths.get(seq, 0)
        if not 0 <= new_length <= length:
            raise ValueError(f"sequence {seq} holds {length} tokens, cannot roll back to {new_length}")
        table = self.tables.get(seq, [])
        keep = self.blocks_for(new_length)
        freed = table[keep:]
        del table[keep:]
        self.free.extend(reversed(freed))
        self.lengths[seq] = new_length
        return freed

    def release(self, seq: int) -> None:
        self.truncate(seq, 0)
        self.tables.pop(seq, None)
        self.lengths.pop(seq, None)

    def slot_index(self, seq: int, start: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(block ids [n], offsets [n]) of token positions start..start+n-1 of ``seq``."""
        pos = torch.arange(start, start + n)
        table = torch.tensor(self.tables[seq], dtype=torch.long)
        return table[pos // self.block_size].to(device), (pos % self.block_size).to(device)

    def check(self) -> None:
        """Invariants: every block is either free or in exactly one table, and tables fit their lengths."""
        used = [b for t in self.tables.values() for b in t]
        if len(set(used)) != len(used):
            raise AssertionError("a block is shared by two sequences (or twice by one)")
        if set(used) & set(self.free) or len(set(self.free)) != len(self.free):
            raise AssertionError("the free list overlaps the tables or repeats a block")
        if len(used) + len(self.free) != self.num_blocks:
            raise AssertionError(f"blocks leaked: {len(used)} used + {len(self.free)} free != {self.num_blocks}")
        for seq, t in self.tables.items():
            if len(t) != self.blocks_for(self.lengths[seq]):
                raise AssertionError(f"sequence {seq}: {len(t)} blocks for {self.lengths[seq]} tokens")


class _PagedLayer(CacheLayerMixin):
    """One layer's block pool ``[num_blocks, H_kv, block_size, D]``; the table is shared."""

    is_croppable = True

    def __init__(self, owner: PagedKVCache) -> None:
        super().__init__()
        self.owner = owner
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[1], key_states.shape[-1], key_states.dtype, key_states.device)

    def allocate(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device) -> None:
        o = self.owner
        shape = (o.table.num_blocks, kv_heads, o.table.block_size, head_dim)
        self.keys = _pool(shape, dtype, device, o.num_layers)
        self.values = _pool(shape, dtype, device, o.num_layers)
        self.device = self.keys.device
        self.is_initialized = True

    def grow_to(self, num_blocks: int) -> None:
        extra = num_blocks - self.keys.shape[0]
        if extra > 0:
            more = _pool((extra, *self.keys.shape[1:]), self.keys.dtype, self.keys.device, self.owner.num_layers)
            self.keys = torch.cat([self.keys, more])
            self.values = torch.cat([self.values, torch.zeros_like(more)])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        B, _, n, _ = key_states.shape  # [B, H_kv, n, D]
        o = self.owner
        for b in range(B):
            o.reserve(b, self.length + n)  # idempotent across layers; grows every pool when the free list runs out
        for b in range(B):
            blk, off = o.table.slot_index(b, self.length, n, key_states.device)
            self.keys[blk, :, off] = key_states[b].transpose(0, 1)  # [n, H_kv, D]
            self.values[blk, :, off] = value_states[b].transpose(0, 1)
        self.length += n
        return self.gather(B)

    def gather(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's pages, in order, as contiguous ``[B, H_kv, length, D]``."""
        tab = torch.tensor([self.owner.table.tables[b] for b in range(batch)], device=self.keys.device)  # [B, nblk]
        H, bs, D = self.keys.shape[1:]

        def _g(pool: torch.Tensor) -> torch.Tensor:
            x = pool[tab]  # [B, nblk, H, bs, D]
            return x.permute(0, 2, 1, 3, 4).reshape(batch, H, -1, D)[:, :, : self.length]

        return _g(self.keys), _g(self.values)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        self.length -= abs(tokens_to_remove)


def _too_big(num_blocks: int, block_size: int, gib: float, num_layers: int, device, why: str) -> RuntimeError:
    return RuntimeError(f"paged KV cache: cannot allocate {num_blocks} blocks of {block_size} tokens ({gib:.3g} GiB of keys "
                        f"and values over {num_layers} layers) on {device} ({why}); lower the batch, the prompt length or "
                        "max_new_tokens, or run with paged=False")


def check_pool_fits(shape: tuple, dtype: torch.dtype, device, num_layers: int) -> None:
    """Raise the clear error now if ``num_layers`` key and value pools of ``shape`` exceed the device's memory."""
    nbytes = 2 * num_layers * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else math.inf
    if nbytes > total:
        raise _too_big(shape[0], shape[2], nbytes / 2**30, num_layers, device, f"the device has {total / 2**30:.3g} GiB")


def _pool(shape: tuple, dtype: torch.dtype, device, num_layers: int) -> torch.Tensor:
    """A zeroed block pool; an allocation failure is one clear error naming the size and the fixes."""
    try:
        return torch.zeros(shape, dtype=dtype, device=device)
    except RuntimeError as exc:  # torch.OutOfMemoryError (CUDA) is a RuntimeError too
        if not isinstance(exc, torch.OutOfMemoryError) and "alloc" not in str(exc).lower():
            raise
        gib = 2 * num_layers * math.prod(shape) * torch.empty(0, dtype=dtype).element_size() / 2**30
        raise _too_big(shape[0], shape[2], gib, num_layers, device, "out of memory") from exc


class PagedKVCache(Cache):
    """A paged KV cache usable as ``model(..., cache=PagedKVCache(...))``.

    All rows of the batch share one slot count (ragged acceptance is handled by
    :class:`SlotCache`'s holes), so rollback frees, per sequence, every block wholly past the
    kept length, and the accepted pages stay where they are.

    The pool starts with ``num_blocks`` blocks (default 16 per row) and, when a write finds the
    free list short, grows (at least doubling, so growth costs O(1) per token) up to ``max_blocks``
    (None: no limit; ``max_blocks=num_blocks`` is a fixed pool, as in a serving engine).
    """

    def __init__(self, num_layers: int, batch_size: int, block_size: int = 16, num_blocks: int | None = None, *,
                 max_blocks: int | None = None) -> None:
        num_blocks = 16 * batch_size if num_blocks is None else num_blocks
        if max_blocks is not None and max_blocks < num_blocks:
            raise ValueError(f"max_blocks ({max_blocks}) must be >= num_blocks ({num_blocks})")
        self.table = BlockTable(num_blocks, block_size)
        self.batch_size_ = batch_size
        self.num_layers = num_layers
        self.max_blocks = max_blocks
        super().__init__(layers=[_PagedLayer(self) for _ in range(num_layers)])

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch_size: int, block_size: int = 16, num_blocks: int | None = None, *,
                  max_blocks: int | None = None) -> PagedKVCache:
        return cls(model.config.get_text_config().num_hidden_layers, batch_size, block_size, num_blocks,
                   max_blocks=max_blocks)

    def allocate(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device) -> None:
        """Allocate every layer's pool now (else at its first write), so that a pool too large fails up front."""
        for layer in self.layers:
            layer.allocate(kv_heads, head_dim, dtype, device)

    def reserve(self, seq: int, new_length: int) -> None:
        """``BlockTable.reserve``, growing the table and every allocated pool first when the free list is short."""
        t = self.table
        short = t.blocks_for(new_length) - len(t.tables.get(seq, [])) - len(t.free)
        if short > 0:
            room = (self.max_blocks - t.num_blocks) if self.max_blocks is not None else short + t.num_blocks
            if room < short:
                raise RuntimeError(f"paged KV cache out of blocks: need {short} more, the pool is at its limit of "
                                   f"max_blocks={self.max_blocks} blocks of {t.block_size}; raise max_blocks")
            extra = min(max(short, t.num_blocks), room)  # at least double
            for layer in self.layers:
                if layer.is_initialized:
                    layer.grow_to(t.num_blocks + extra)
            t.grow(extra)
        t.reserve(seq, new_length)

    def crop(self, tokens_to_remove: int) -> None:
        length = self.layers[0].length
        keep = length - abs(tokens_to_remove)
        for layer in self.layers:
            layer.crop(tokens_to_remove)
        for b in range(self.batch_size_):
            if b in self.table.tables:
                self.table.truncate(b, keep)

    def blocks_in_use(self) -> int:
        return sum(len(t) for t in self.table.tables.values())
