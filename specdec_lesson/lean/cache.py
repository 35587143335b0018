"""A static KV cache with one length per row: rollback is moving that row's length pointer.

Every layer's keys and values live in two tensors allocated once, ``[layers, B, kv_heads, capacity, head_dim]``
(zeros, so a slot never read still holds a finite number).  Row b holds its ``lens[b]`` valid tokens in slots
``0..lens[b]-1``, with no holes: rows of a ragged batch simply have different lengths.  So

* rejecting drafts is ``lens[b] = kept`` (the rejected entries stay where they are and are overwritten by the
  next forward, never read before: a key at or past a row's length is masked out);
* a forward of n tokens writes row b's valid tokens at ``lens[b]..``; a token marked invalid (left padding,
  the engine's holes) is written after them, past the row's new length, where nothing will read it;
* the attention mask is needed only when the rows differ in length, a token is invalid, or a token tree
  restricts what the new tokens see; a one-token step of equal-length rows has none.

:meth:`StaticKVCache.plan` turns one forward's shape into a :class:`Step` (where to write, the positions, the
number of keys to read and the mask, if any); the model calls :meth:`write` per layer and :meth:`advance` once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Step", "StaticKVCache"]


@dataclass(slots=True)
class Step:
    """One forward's plan (see :meth:`StaticKVCache.plan`)."""

    n_valid: list[int]  # valid new tokens per row (host)
    keys: int  # keys to read per row: the longest row's length after the write, + its invalid tokens
    write_start: int | None  # all rows write slots write_start.. (equal lengths, no invalid tokens), else:
    write_rows: torch.Tensor | None  # [B, n] row of each new token's slot
    write_slots: torch.Tensor | None  # [B, n] slot of each new token
    start: int | None  # every row's positions are start..start+n-1, else:
    positions: torch.Tensor | None  # [B, n] position of each new token
    mask: torch.Tensor | None  # [B, 1, n, keys] bool, True = visible; None = every key visible


class StaticKVCache:
    """Preallocated keys / values for ``batch`` rows of up to ``capacity`` tokens each, one length per row."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token per row, got {capacity}")
        shape = (num_layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [layers, B, kv_heads, capacity, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = [0] * batch  # host copy of the per-row lengths
        self.lens_t = torch.zeros(batch, dtype=torch.long, device=device)  # [B]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` per row: a run that outgrows its capacity doubles it (one copy)."""
        if tokens <= self.capacity:
            return
        grow = max(tokens, 2 * self.capacity) - self.capacity
        pad = (0, 0, 0, grow)  # the capacity dimension
        self.k = torch.nn.functional.pad(self.k, pad)
        self.v = torch.nn.functional.pad(self.v, pad)

    def set_lengths(self, lens: list[int]) -> None:
        """Rollback (and compaction's bookkeeping): row b keeps its first ``lens[b]`` tokens."""
        if len(lens) != self.batch or any(not 0 <= x <= self.capacity for x in lens):
            raise ValueError(f"lengths must list, per row, a count in 0..{self.capacity}; got {lens}")
        self.lens = [int(x) for x in lens]
        self.lens_t = torch.tensor(self.lens, dtype=torch.long, device=self.k.device)

    def plan(self, n: int, new_valid: torch.Tensor | None = None, block_mask: torch.Tensor | None = None,
             positions: torch.Tensor | None = None) -> Step:
        """The plan of a forward of n new tokens per row.  ``new_valid [B, n]`` (None: all valid) marks real
        tokens; ``block_mask [B or 1, n, n]`` (None: causal) says which new tokens each new token sees (itself
        always); ``positions [B, n]`` (None: each row's length + its valid tokens so far, as ``SlotCache``)."""
        B, dev, lens = self.batch, self.k.device, self.lens
        uniform = min(lens) == max(lens)
        holes = new_valid is not None and not bool(new_valid.all())
        if not holes:
            self.reserve(max(lens) + n)
            keys = max(lens) + n
            n_valid = [n] * B
            offs = torch.arange(n, device=dev)  # [n]
            if uniform:
                rows = cols = None
                start = lens[0]
                mask = None if n == 1 and block_mask is None else (  # [1, n, keys]: key j visible to token i
                    torch.arange(keys, device=dev)[None, :] <= start + offs[:, None])[None]
            else:
                start = None
                rows = torch.arange(B, device=dev)[:, None].expand(B, n)  # [B, n]
                cols = self.lens_t[:, None] + offs[None, :]  # [B, n]
                mask = torch.arange(keys, device=dev)[None, None, :] < (cols + 1)[:, :, None]  # [B, n, keys]
            if block_mask is not None:
                mask = self._inner(mask, block_mask, None, rows, cols, start, n, keys)
            if positions is None and not uniform:
                positions = cols
            return Step(n_valid, keys, start if uniform else None, rows, cols,
                        start if positions is None else None, positions,
                        None if mask is None else mask[:, None])
        valid = new_valid.to(torch.bool)  # [B, n]
        c = valid.long().cumsum(1)  # [B, n] valid tokens up to and including each
        nv = c[:, -1:]  # [B, 1]
        base = self.lens_t[:, None]  # [B, 1]
        cols = torch.where(valid, base + c - 1, base + nv + (~valid).long().cumsum(1) - 1)  # [B, n] invalid ones last
        rows = torch.arange(B, device=dev)[:, None].expand(B, n)  # [B, n]
        self.reserve(max(lens) + n)
        keys = max(lens) + n
        past = torch.arange(keys, device=dev)[None, None, :] < base[:, :, None]  # [B, 1, keys]
        mask = self._inner(past.expand(B, n, keys), block_mask, valid, rows, cols, None, n, keys)
        if positions is None:
            positions = (base + c - 1).clamp_min(0)  # [B, n]
        return Step(nv[:, 0].tolist(), keys, None, rows, cols, None, positions, mask[:, None])

    @staticmethod
    def _inner(mask, block_mask, valid, rows, cols, start, n, keys) -> torch.Tensor:
        """``mask`` with the new tokens' columns set from ``block_mask`` (or causal), hiding invalid tokens
        (a token always sees itself, so no query row is fully masked: an all-masked softmax is NaN)."""
        dev = mask.device
        eye = torch.eye(n, dtype=torch.bool, device=dev)  # [n, n]
        inner = torch.ones(n, n, dtype=torch.bool, device=dev).tril() if block_mask is None else block_mask.to(torch.bool)
        inner = inner if inner.dim() == 3 else inner[None]  # [B or 1, n, n]
        if valid is not None:
            inner = inner & valid[:, None, :]
        inner = inner | eye
        if cols is None:  # equal lengths: the new tokens are the last n columns
            past = torch.ones(1, 1, start, dtype=torch.bool, device=dev)  # [1, 1, start]
            return torch.cat([past.expand(inner.shape[0], n, start), inner], dim=2)  # [B or 1, n, keys]
        B = cols.shape[0]
        mask = mask.expand(B, n, keys).clone() if mask.shape[0] != B or mask.stride(1) == 0 else mask.clone()
        mask.scatter_(2, cols[:, None, :].expand(B, n, n), inner.expand(B, n, n))  # [B, n, keys]
        return mask

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new ``k, v [B, n, kv_heads, D]`` as ``step`` says; returns the keys and values to
        attend over, ``[B, kv_heads, step.keys, D]`` each (views of the cache)."""
        kc, vc = self.k[layer], self.v[layer]  # [B, kv_heads, capacity, D]
        if step.write_start is not None:
            end = step.write_start + k.shape[1]
            kc[:, :, step.write_start:end] = k.transpose(1, 2)
            vc[:, :, step.write_start:end] = v.transpose(1, 2)
        else:
            kc[step.write_rows, :, step.write_slots] = k  # [B, n, kv_heads, D] at (row, slot)
            vc[step.write_rows, :, step.write_slots] = v
        return kc[:, :, : step.keys], vc[:, :, : step.keys]

    def advance(self, step: Step) -> None:
        """After the forward: every row's length grows by its valid new tokens."""
        if min(step.n_valid) == max(step.n_valid):
            self.lens = [x + step.n_valid[0] for x in self.lens]
            self.lens_t = self.lens_t + step.n_valid[0]
        else:
            self.set_lengths([x + nv for x, nv in zip(self.lens, step.n_valid)])

    def move(self, row: int, src: list[int], dst: int) -> None:
        """Copy row ``row``'s slots ``src`` (in that order) to slots ``dst, dst + 1, ...`` in every layer."""
        if not src:
            return
        idx = torch.tensor(src, dtype=torch.long, device=self.k.device)
        self.k[:, row, :, dst:dst + len(src)] = self.k[:, row, :, idx]  # the gather copies first: overlap is safe
        self.v[:, row, :, dst:dst + len(src)] = self.v[:, row, :, idx]
