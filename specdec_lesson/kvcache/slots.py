"""KV caches with rollback: contiguous crop, a paged cache, and per-row slot bookkeeping.

Speculation writes K+1 positions into the target's cache and keeps only the accepted ones.
Two storages are taught here:

* contiguous (Hugging Face ``DynamicCache``): rollback is a crop of the tail;
* paged (:class:`PagedKVCache`): fixed-size blocks, a block table per sequence and a free
  list; appending allocates blocks, rollback frees every block wholly past the new length
  and keeps the accepted pages.  It is a ``transformers.Cache`` so it backs a real model.  The
  engines size its pool from the run (batch x (prompt + max_new_tokens + drafts per step)) and
  allocate it up front; it grows if a ragged batch needs more.

:class:`SlotCache` sits on top of either and handles ragged batches: every row shares the
same slot layout, and a row that accepted fewer tokens than another keeps *holes* (slots
marked invalid in a boolean map) that a 4D attention mask hides; each row has its own
position counter.  After a crop of the slots no row sees a rejected token (pitfalls 6 and 7 of docs/pitfalls.md).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache

from .paged import BlockTable, PagedKVCache, _PagedLayer, check_pool_fits

__all__ = ["crop", "select_hidden", "BlockTable", "PagedKVCache", "SlotCache"]


def select_hidden(out, which: bool | tuple[int, ...]) -> torch.Tensor | None:
    """The hidden states a drafter asked for from an HF output with ``hidden_states``: None for False, the last
    one (after the final norm) for True, else ``hidden_states[i]`` for each i concatenated [B, n, len * H]."""
    if which is False or which is None:
        return None
    if which is True:
        return out.hidden_states[-1]
    return torch.cat([out.hidden_states[i] for i in which], -1)


def crop(cache: Cache, keep: int) -> None:
    """Roll a contiguous (or paged) cache back to its first ``keep`` slots."""
    length = cache.get_seq_length()
    if not 0 <= keep <= length:
        raise ValueError(f"cannot crop a cache of {length} slots to {keep}")
    if keep < length:
        cache.crop(keep - length)  # transformers 5: a negative count removes that many


def _paged_for_run(model, batch: int, device, block_size: int, capacity: int | None, max_blocks: int | None) -> PagedKVCache:
    if capacity is None:
        return PagedKVCache.for_model(model, batch, block_size, max_blocks=max_blocks)
    need = batch * -(-capacity // block_size)
    if max_blocks is not None and need > max_blocks:
        raise ValueError(f"paged KV cache too small for this run: {batch} rows x {capacity} tokens need {need} blocks of "
                         f"{block_size}, max_blocks is {max_blocks}; raise max_blocks or lower the batch / max_new_tokens")
    cfg = model.config.get_text_config()
    kv_heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None)
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // cfg.num_attention_heads if kv_heads else None)
    if not (kv_heads and head_dim):  # an unusual config: the pools are allocated (and grown) at the first write
        return PagedKVCache.for_model(model, batch, block_size, need, max_blocks=max_blocks)
    dtype = next(model.parameters()).dtype
    check_pool_fits((need, kv_heads, block_size, head_dim), dtype, device, cfg.num_hidden_layers)  # before any list
    cache = PagedKVCache.for_model(model, batch, block_size, need, max_blocks=max_blocks)
    cache.allocate(kv_heads, head_dim, dtype, device)
    return cache


class SlotCache:
    """One model's cache plus a per-row map of valid slots and per-row positions.

    ``forward`` appends n slots to every row (``new_valid`` marks which are real tokens),
    builds the 4D additive attention mask (a row sees its own valid slots, causally, or through
    ``block_mask`` for a token tree), and returns logits (and last hidden states).
    ``rollback(since, keep)`` keeps, per row, the first ``keep[b]`` slots appended since slot
    ``since`` and crops the slots no row needs any more.
    """

    def __init__(self, model: torch.nn.Module, batch_size: int, device, *, paged: bool = False, block_size: int = 16,
                 use_kernels: bool | None = None, capacity: int | None = None, max_blocks: int | None = None) -> None:
        """``capacity``: tokens per row the run will hold (prompt + max_new_tokens + one step's drafts); a paged
        pool is then sized and allocated for it up front (it still grows if a ragged batch's shared slot
        layout runs past it), and a run whose pool cannot be allocated, or exceeds ``max_blocks``, fails here."""
        self.model = model
        self.use_kernels = use_kernels  # compaction by the Triton kernel: None = when CUDA and triton are there
        self.cache: Cache = DynamicCache()
        if paged:
            self.cache = _paged_for_run(model, batch_size, device, block_size, capacity, max_blocks)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, S]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] next position per row
        self.holes = False  # host-side: does any row have an invalid slot?
        self.dtype = next(model.parameters()).dtype

    @property
    def num_slots(self) -> int:
        return self.valid.shape[1]

    def forward(
        self, tokens: torch.Tensor, new_valid: torch.Tensor | None = None, *, has_holes: bool = False,
        block_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
        output_hidden: bool | tuple[int, ...] = False, logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``tokens [B, n]``; returns ``(logits [B, n, V], hidden or None)``: ``output_hidden=True`` gives the
        last hidden state after the final norm [B, n, H], a tuple of layer indices the residual streams entering
        those layers (HF ``hidden_states[i]``) concatenated [B, n, len * H] (``select_hidden``).

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
            use_cache=True, output_hidden_states=bool(output_hidden), **kw,
        )
        self.valid = valid
        self.lengths = self.lengths + new_valid.long().sum(1)
        return out.logits, select_hidden(out, output_hidden)

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
        output_hidden: bool | tuple[int, ...] = False,
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
            use_cache=True, output_hidden_states=bool(output_hidden),
        )
        self.valid = torch.cat([self.valid, torch.ones(B, n, dtype=torch.bool, device=tokens.device)], dim=1)
        self.lengths = self.lengths + n
        return out.logits, select_hidden(out, output_hidden)

    @torch.inference_mode()
    def compact(self, since: int, paths: list[list[int]]) -> None:
        """Keep, in row b, the slots ``since + paths[b][i]`` (in that order) moved to the
        contiguous slots ``since + i``, and drop every other slot from ``since`` on.

        After tree verification ``paths[b]`` lists the accepted path's tree slots (offsets from
        ``since``, increasing); the move is :func:`specdec_lesson.kernels.reference.compact_kv`
        on every layer, for the contiguous (``DynamicCache``) and the paged cache alike."""
        from ..kernels.reference import compact_kv  # torch only, no triton

        if self.use_kernels or (self.use_kernels is None and self.valid.is_cuda):
            from ..kernels import compact_kv_triton, kernels_available, triton_importable

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
