"""The engine's cache interface on the lean forward: :class:`LeanSlotCache`, and :func:`make_cache`, which picks it.

The engines (``speculative_generate``, ``autoregressive_generate``, ``tree_generate``, ``ModelDrafter``) talk to a
:class:`~specdec_lesson.kvcache.SlotCache`: a shared slot layout in which a row that accepted fewer drafts than
another keeps *holes*, ``rollback(since, keep)`` counting slots from ``since``.  :class:`LeanSlotCache` keeps that
bookkeeping (``valid [B, S]``, ``num_slots``, ``lengths``, ``holes``) so the engines run unchanged, but stores no
hole: each row's valid tokens are packed at the front of its static cache (:mod:`.cache`), in slot order, so a
row's length is its count of valid slots and every rollback or compaction is a length per row (plus, for a
tree's accepted path, one move of the path's entries).

``make_cache(model, ...)`` returns a :class:`LeanSlotCache` when the lean path is asked for (``lean=True``, or
``lean=None`` with ``LEAN_BY_DEFAULT``) and the model is supported, else the Hugging Face ``SlotCache``.
"""

from __future__ import annotations

import warnings

import torch

from ..kvcache import SlotCache
from .model import LeanLlama, UnsupportedModelError, lean_model

__all__ = ["LEAN_BY_DEFAULT", "LeanSlotCache", "make_cache"]

LEAN_BY_DEFAULT = True  # engines with lean=None use the lean forward for supported models (False: Hugging Face's)


class LeanSlotCache:
    """``SlotCache``'s interface (forward, rollback, forward_tree, compact) on the lean forward of a Llama."""

    def __init__(self, model: torch.nn.Module, batch_size: int, device, *, capacity: int | None = None,
                 lean: LeanLlama | None = None, use_kernels: bool | None = None) -> None:
        """``capacity``: tokens per row the run will hold (allocated now; a longer run doubles it once)."""
        self.model = model
        self.lean = lean if lean is not None else lean_model(model)
        self.cache = self.lean.new_cache(batch_size, capacity or 256, device)
        self.use_kernels = use_kernels  # accepted for SlotCache's signature; compaction here is one gather
        self.batch, self.device = batch_size, device
        # the engine's slot map valid [B, S]; None while every slot is valid (no padding, no holes, the usual
        # batch of one): then it is only a count, and a step's bookkeeping is no tensor work at all
        self._valid: torch.Tensor | None = None
        self._slots = 0
        self.holes = False
        self.dtype = self.lean.dtype

    @property
    def valid(self) -> torch.Tensor:
        """[B, S] bool: which slots hold a token (built on demand while every slot does)."""
        if self._valid is None:
            return torch.ones(self.batch, self._slots, dtype=torch.bool, device=self.device)
        return self._valid

    @valid.setter
    def valid(self, value: torch.Tensor) -> None:
        self._valid, self._slots = value, value.shape[1]

    @property
    def dense(self) -> bool:
        """Whether every slot is valid."""
        return self._valid is None

    @property
    def num_slots(self) -> int:
        return self._slots

    @property
    def lengths(self) -> torch.Tensor:
        """[B] tokens per row (= next position, = valid slots)."""
        return self.cache.lens_t

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, new_valid: torch.Tensor | None = None, *, has_holes: bool = False,
        block_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
        output_hidden: bool | tuple[int, ...] = False, logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`SlotCache.forward`: ``(logits [B, n or logits_to_keep, V], hidden or None)``."""
        B, n = tokens.shape
        step = self.cache.plan(n, new_valid, block_mask, positions)
        out = self.lean.forward(tokens, self.cache, step, output_hidden, logits_to_keep)
        if self.dense and (new_valid is None or (not has_holes and bool(new_valid.all()))):
            self._slots += n
        else:
            if new_valid is None:
                new_valid = torch.ones(B, n, dtype=torch.bool, device=tokens.device)
            self.valid = torch.cat([self.valid, new_valid.to(torch.bool)], dim=1)
        self.holes = self.holes or has_holes
        return out

    @torch.inference_mode()
    def rollback(self, since: int, keep: list[int]) -> None:
        """Keep the first ``keep[b]`` slots appended since slot ``since`` in row b (host list): each row's
        length becomes its count of valid slots kept; nothing is copied."""
        S = self.num_slots
        n = S - since
        if len(keep) != self.batch or any(not 0 <= k <= n for k in keep):
            raise ValueError(f"keep must list, per row, a count in 0..{n}; got {keep}")
        if self.dense and min(keep) == max(keep):  # every slot valid, every row keeps as many: a count
            self._slots = since + keep[0]
            self.cache.set_lengths([self._slots] * len(keep))
            return
        if min(keep) < max(keep):
            self.holes = True
        valid = self.valid  # [B, S]
        kept = torch.arange(n, device=valid.device)[None, :] < torch.tensor(keep, device=valid.device)[:, None]
        self.valid = torch.cat([valid[:, :since], valid[:, since:] & kept], dim=1)[:, : since + max(keep)]
        self.cache.set_lengths(self.valid.sum(1).tolist())

    @torch.inference_mode()
    def forward_tree(
        self, tokens: torch.Tensor, tree_start: int, tree_visible: torch.Tensor, positions: torch.Tensor, *,
        output_hidden: bool | tuple[int, ...] = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`SlotCache.forward_tree`: tree nodes that see every valid slot before ``tree_start`` and, from
        ``tree_start`` on, the slots marked in ``tree_visible [B or 1, n, S_old - tree_start + n]`` (and themselves)."""
        B, n = tokens.shape
        S_old = self.num_slots
        width = S_old - tree_start + n
        if not 0 <= tree_start <= S_old or tree_visible.shape[-2:] != (n, width) or tree_visible.dtype != torch.bool:
            raise ValueError(f"tree_visible must be a [B or 1, {n}, {width}] bool tensor, got {tuple(tree_visible.shape)}")
        dev = tokens.device
        valid = torch.cat([self.valid, torch.ones(B, n, dtype=torch.bool, device=dev)], dim=1)  # [B, S_old + n]
        tree = tree_visible.expand(B, n, width).clone()  # [B, n, width]
        tree[:, :, width - n:] |= torch.eye(n, dtype=torch.bool, device=dev)
        before = torch.ones(B, n, tree_start, dtype=torch.bool, device=dev)  # [B, n, tree_start]
        allowed = torch.cat([before, tree], dim=2) & valid[:, None, :]  # [B, n, S_old + n] over the engine's slots
        step = self.cache.plan(n, None, None, positions)
        keys = step.keys
        col = torch.where(valid, valid.long().cumsum(1) - 1, keys)  # [B, S_old + n] slot -> cache index (keys: none)
        mask = torch.zeros(B, n, keys + 1, dtype=torch.bool, device=dev)
        mask.scatter_(2, col[:, None, :].expand(B, n, S_old + n), allowed)
        step.mask = mask[:, None, :, :keys]  # [B, 1, n, keys]
        out = self.lean.forward(tokens, self.cache, step, output_hidden)
        if self.dense:
            self._slots += n  # the tree's nodes are all valid
        else:
            self.valid = valid
        return out

    @torch.inference_mode()
    def compact(self, since: int, paths: list[list[int]]) -> None:
        """As :meth:`SlotCache.compact`: keep, in row b, the slots ``since + paths[b][i]`` (in that order) as the
        slots ``since + i`` and drop every other slot from ``since`` on (one gather per row over all layers)."""
        S, B = self.num_slots, self.batch
        if len(paths) != B or any(not 0 <= o < S - since for p in paths for o in p):
            raise ValueError(f"paths must list, per row, slot offsets in 0..{S - since - 1}; got {paths}")
        valid = self.valid.tolist()
        for b, p in enumerate(paths):
            if any(not valid[b][since + o] for o in p):
                raise ValueError(f"paths must name valid slots; row {b} names a hole among {p}")
            base = sum(valid[b][:since])  # the row's tokens before `since`
            index = [base + sum(valid[b][since:since + o]) for o in p]  # cache index of each kept slot
            if index != list(range(base, base + len(p))):
                self.cache.move(b, index, base)
        lens = [len(p) for p in paths]
        if self.dense and min(lens) == max(lens):  # every kept slot valid: still a count
            self._slots = since + lens[0]
            self.cache.set_lengths([self._slots] * B)
            return
        if min(lens) < max(lens):
            self.holes = True
        n_valid = torch.tensor(lens, dtype=torch.long, device=self.device)  # [B]
        kept = torch.arange(S - since, device=self.device)[None, :] < n_valid[:, None]  # [B, S - since]
        self.valid = torch.cat([self.valid[:, :since], kept], dim=1)[:, : since + max(lens)]
        self.cache.set_lengths(self.valid.sum(1).tolist())


def make_cache(model: torch.nn.Module, batch_size: int, device, *, lean: bool | None = None, paged: bool = False,
               block_size: int = 16, use_kernels: bool | None = None, capacity: int | None = None,
               max_blocks: int | None = None) -> SlotCache | LeanSlotCache:
    """The engine's cache for ``model``: a :class:`LeanSlotCache` when ``lean`` (None: ``LEAN_BY_DEFAULT``) and the
    model is one the lean forward runs (:func:`~specdec_lesson.lean.model.check_supported`), else the Hugging Face
    :class:`~specdec_lesson.kvcache.SlotCache` with the other arguments.  ``paged=True`` always takes the Hugging
    Face path (the lean cache is contiguous).  An unsupported model with ``lean=True`` warns once, naming why."""
    if lean is not None and not isinstance(lean, bool):
        raise ValueError(f"lean must be True, False or None (the default, LEAN_BY_DEFAULT), got {lean!r}")
    if (LEAN_BY_DEFAULT if lean is None else lean) and not paged:
        try:
            fast = lean_model(model)
        except UnsupportedModelError as exc:
            if lean:
                warnings.warn(str(exc), stacklevel=2)
        else:
            return LeanSlotCache(model, batch_size, device, capacity=capacity, lean=fast, use_kernels=use_kernels)
    return SlotCache(model, batch_size, device, paged=paged, block_size=block_size, use_kernels=use_kernels,
                     capacity=capacity, max_blocks=max_blocks)
