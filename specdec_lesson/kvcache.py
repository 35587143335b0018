"""KV caches with rollback: contiguous crop, a paged cache, and per-row slot bookkeeping.

Speculation writes K+1 positions into the target's cache and keeps only the accepted ones.
Two storages are taught here:

* contiguous (Hugging Face ``DynamicCache``): rollback is a crop of the tail;
* paged (:class:`PagedKVCache`): fixed-size blocks, a block table per sequence and a free
  list; appending allocates blocks, rollback frees every block wholly past the new length
  and keeps the accepted pages.  It is a ``transformers.Cache`` so it backs a real model.

:class:`SlotCache` sits on top of either and handles ragged batches: every row shares the
same slot layout, and a row that accepted fewer tokens than another keeps *holes* (slots
marked invalid in a boolean map) that a 4D attention mask hides; each row has its own
position counter.  After a crop of the slots no row sees a rejected token (DESIGN pitfalls 6, 7).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

__all__ = ["crop", "BlockTable", "PagedKVCache", "SlotCache"]


def crop(cache: Cache, keep: int) -> None:
    """Roll a contiguous (or paged) cache back to its first ``keep`` slots."""
    length = cache.get_seq_length()
    if not 0 <= keep <= length:
        raise ValueError(f"cannot crop a cache of {length} slots to {keep}")
    if keep < length:
        cache.crop(keep - length)  # transformers 5: a negative count removes that many


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
        o = self.owner
        shape = (o.table.num_blocks, key_states.shape[1], o.table.block_size, key_states.shape[-1])
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(shape, dtype=value_states.dtype, device=value_states.device)
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        B, _, n, _ = key_states.shape  # [B, H_kv, n, D]
        o = self.owner
        for b in range(B):
            o.table.reserve(b, self.length + n)  # idempotent across layers
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


class PagedKVCache(Cache):
    """A paged KV cache usable as ``model(..., cache=PagedKVCache(...))``.

    All rows of the batch share one slot count (ragged acceptance is handled by
    :class:`SlotCache`'s holes), so rollback frees, per sequence, every block wholly past the
    kept length, and the accepted pages stay where they are.
    """

    def __init__(self, num_layers: int, batch_size: int, block_size: int = 16, num_blocks: int = 4096) -> None:
        self.table = BlockTable(num_blocks, block_size)
        self.batch_size_ = batch_size
        super().__init__(layers=[_PagedLayer(self) for _ in range(num_layers)])

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch_size: int, block_size: int = 16, num_blocks: int = 4096) -> PagedKVCache:
        return cls(model.config.get_text_config().num_hidden_layers, batch_size, block_size, num_blocks)

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


class SlotCache:
    """One model's cache plus a per-row map of valid slots and per-row positions.

    ``forward`` appends n slots to every row (``new_valid`` marks which are real tokens),
    builds the 4D additive attention mask (a row sees its own valid slots, causally, or through
    ``block_mask`` for a token tree), and returns logits (and last hidden states).
    ``rollback(since, keep)`` keeps, per row, the first ``keep[b]`` slots appended since slot
    ``since`` and crops the slots no row needs any more.
    """

    def __init__(self, model: torch.nn.Module, batch_size: int, device, *, paged: bool = False, block_size: int = 16,
                 use_kernels: bool | None = None) -> None:
        self.model = model
        self.use_kernels = use_kernels  # compaction by the Triton kernel: None = when CUDA and triton are there
        self.cache: Cache = PagedKVCache.for_model(model, batch_size, block_size) if paged else DynamicCache()
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, S]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] next position per row
        self.holes = False  # host-side: does any row have an invalid slot?
        self.dtype = next(model.parameters()).dtype

    @property
    def num_slots(self) -> int:
        return self.valid.shape[1]

    def forward(
        self, tokens: torch.Tensor, new_valid: torch.Tensor | None = None, *, has_holes: bool = False,
        block_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None, output_hidden: bool = False,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``tokens [B, n]``; returns ``(logits [B, n, V], hidden [B, n, H] or None)``.

        ``logits_to_keep=m > 0`` computes logits for the last m positions only (a prefill needs
        none of the 49152-wide rows of its prompt tokens); hidden states are always complete."""
        B, n = tokens.shape
        if new_valid is None:
            new_valid = torch.ones(B, n, dtype=torch.bool, device=tokens.device)
        S_old = self.num_slots
        if positions is None:
            positions = self.lengths[:, None] + new_valid.long().cumsum(1) - 1  # [B, n]
            positions = positions.clamp_min(0)
        self.holes = self.holes or has_holes
        valid = torch.cat([self.valid, new_valid], dim=1)  # [B, S_old + n]
        mask = None
        if self.holes or block_mask is not None:
            causal = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()  # [n, n]
            inner = block_mask if block_mask is not None else causal  # [B or 1, n, n] or [n, n]
            inner = inner.expand(B, n, n) if inner.dim() == 3 else inner.unsqueeze(0).expand(B, n, n)
            past = self.valid[:, None, :].expand(B, n, S_old)  # [B, n, S_old]
            # every query also sees itself: a hole's query then has one finite score (no NaN from an
            # all-masked softmax, whose NaN keys/values would poison later rows through 0 * NaN)
            eye = torch.eye(n, dtype=torch.bool, device=tokens.device)  # [n, n]
            allowed = torch.cat([past, (inner & new_valid[:, None, :]) | eye], dim=2)  # [B, n, S_old + n]
            mask = torch.zeros(B, 1, n, S_old + n, dtype=self.dtype, device=tokens.device)
            mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)  # [B, 1, n, S]
        kw = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
        out = self.model(
            input_ids=tokens, attention_mask=mask, position_ids=positions, cache=self.cache,
            use_cache=True, output_hidden_states=output_hidden, **kw,
        )
        self.valid = valid
        self.lengths = self.lengths + new_valid.long().sum(1)
        hidden = out.hidden_states[-1] if output_hidden else None
        return out.logits, hidden

    def rollback(self, since: int, keep: list[int]) -> None:
        """Keep the first ``keep[b]`` slots appended since slot ``since`` in row b (host list)."""
        S = self.num_slots
        n = S - since
        if len(keep) != self.valid.shape[0] or any(not 0 <= k <= n for k in keep):
            raise ValueError(f"keep must list, per row, a count in 0..{n}; got {keep}")
        new_S = since + max(keep)
        if min(keep) < max(keep):
            self.holes = True
        offs = torch.arange(n, device=self.valid.device)  # [n]
        kept = offs[None, :] < torch.tensor(keep, device=self.valid.device)[:, None]  # [B, n]
        self.valid = torch.cat([self.valid[:, :since], self.valid[:, since:] & kept], dim=1)[:, :new_S]
        crop(self.cache, new_S)
        self.lengths = self.valid.long().sum(1)

    # ------------------------------------------------------------------ token trees (tree/)

    def forward_tree(
        self, tokens: torch.Tensor, tree_start: int, tree_visible: torch.Tensor, positions: torch.Tensor, *,
        output_hidden: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``tokens [B, n]`` (tree nodes) that see every valid slot before ``tree_start`` and,
        among the slots from ``tree_start`` on (earlier tree nodes, then these n), only those
        marked in ``tree_visible [B or 1, n, S_old - tree_start + n]`` (their ancestors and
        themselves).  Used to draft a token tree level by level; returns like :meth:`forward`."""
        B, n = tokens.shape
        S_old = self.num_slots
        width = S_old - tree_start + n
        if not 0 <= tree_start <= S_old or tree_visible.shape[-2:] != (n, width) or tree_visible.dtype != torch.bool:
            raise ValueError(f"tree_visible must be a [B or 1, {n}, {width}] bool tensor, got {tuple(tree_visible.shape)}")
        eye = torch.eye(n, dtype=torch.bool, device=tokens.device)  # [n, n]
        tree = tree_visible.expand(B, n, width).clone()  # [B, n, width]
        tree[:, :, width - n:] |= eye
        before = self.valid[:, None, :tree_start].expand(B, n, tree_start)  # [B, n, tree_start]
        tree[:, :, : S_old - tree_start] &= self.valid[:, None, tree_start:]
        allowed = torch.cat([before, tree], dim=2)  # [B, n, S_old + n]
        mask = torch.zeros(B, 1, n, S_old + n, dtype=self.dtype, device=tokens.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)  # [B, 1, n, S]
        out = self.model(
            input_ids=tokens, attention_mask=mask, position_ids=positions, cache=self.cache,
            use_cache=True, output_hidden_states=output_hidden,
        )
        self.valid = torch.cat([self.valid, torch.ones(B, n, dtype=torch.bool, device=tokens.device)], dim=1)
        self.lengths = self.lengths + n
        return out.logits, out.hidden_states[-1] if output_hidden else None

    @torch.inference_mode()
    def compact(self, since: int, paths: list[list[int]]) -> None:
        """Keep, in row b, the slots ``since + paths[b][i]`` (in that order) moved to the
        contiguous slots ``since + i``, and drop every other slot from ``since`` on.

        After tree verification ``paths[b]`` lists the accepted path's tree slots (offsets from
        ``since``, increasing); the move is :func:`specdec_lesson.kernels.reference.compact_kv`
        on every layer, for the contiguous (``DynamicCache``) and the paged cache alike."""
        from .kernels.reference import compact_kv  # torch only, no triton

        if self.use_kernels or (self.use_kernels is None and self.valid.is_cuda):
            from .kernels import compact_kv_triton, kernels_available, triton_importable

            # on CUDA the compiled kernel; use_kernels=True on a CPU runs it in the Triton interpreter
            if kernels_available() if self.valid.is_cuda else triton_importable():
                compact_kv = compact_kv_triton  # same signature, bit-equal (tests/test_kernels.py)
            elif self.use_kernels:
                raise ValueError("use_kernels=True needs triton (and CUDA for speed)")

        S = self.num_slots
        B = self.valid.shape[0]
        if len(paths) != B or any(not 0 <= o < S - since for p in paths for o in p):
            raise ValueError(f"paths must list, per row, slot offsets in 0..{S - since - 1}; got {paths}")
        lens = [len(p) for p in paths]
        width = max(max(lens), 1)
        dev = self.valid.device
        src = torch.tensor([[since + o for o in p] + [since] * (width - len(p)) for p in paths], dtype=torch.long, device=dev)
        dst = torch.full((B,), since, dtype=torch.long, device=dev)  # [B]
        n_valid = torch.tensor(lens, dtype=torch.long, device=dev)  # [B]
        moves = any(p != list(range(len(p))) for p in paths)
        for layer in self.cache.layers if moves else []:
            if not getattr(layer, "is_initialized", False):
                continue
            if isinstance(layer, _PagedLayer):  # compact a contiguous copy of the slots since `since`, write it back
                where = [self.cache.table.slot_index(b, since, S - since, dev) for b in range(B)]  # (blocks, offsets)
                keys = torch.stack([layer.keys[blk, :, off].transpose(0, 1) for blk, off in where])  # [B, H, S - since, D]
                values = torch.stack([layer.values[blk, :, off].transpose(0, 1) for blk, off in where])
                compact_kv(keys, values, src - since, dst - since, n_valid)
                for b, (blk, off) in enumerate(where):
                    layer.keys[blk[:lens[b]], :, off[:lens[b]]] = keys[b, :, :lens[b]].transpose(0, 1)  # [n, H, D]
                    layer.values[blk[:lens[b]], :, off[:lens[b]]] = values[b, :, :lens[b]].transpose(0, 1)
            else:
                compact_kv(layer.keys, layer.values, src, dst, n_valid)
        new_S = since + max(lens)
        if min(lens) < max(lens):
            self.holes = True
        kept = torch.arange(S - since, device=dev)[None, :] < n_valid[:, None]  # [B, S - since]
        self.valid = torch.cat([self.valid[:, :since], kept], dim=1)[:, :new_S]
        crop(self.cache, new_S)
        self.lengths = self.valid.long().sum(1)
