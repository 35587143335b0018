"""A small causal LM as the draft: autoregressive drafting with its own KV cache (and tree hooks)."""

from __future__ import annotations

import torch

from ..lean import make_cache
from ..sampling import SamplingConfig, as_float, sample_from_probs
from .base import Drafter

__all__ = ["ModelDrafter"]


class ModelDrafter(Drafter):
    """A small causal LM drafting autoregressively with its own KV cache.

    After a step in which row b accepted n of K drafts, the draft cache keeps the n drafts it
    had fed (at most K-1: the K-th draft was sampled but never fed), and the tokens it has not
    seen become the row's *pending* block: ``[next]``, or ``[d_K, bonus]`` when all K passed,
    so the bonus token's KV entry is never missing (pitfall 3c).  Rows with one pending token
    get a hole on the left.
    """

    def __init__(self, model: torch.nn.Module, *, paged: bool = False, lean: bool | None = None) -> None:
        """``lean``: draft through the lean forward when the model is a supported Llama (``lean.make_cache``)."""
        self.model = model
        self.paged = paged
        self.lean = lean
        self.forwards = 0

    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        B, L = prompt_ids.shape
        self.state = make_cache(self.model, B, prompt_ids.device, lean=self.lean, paged=self.paged)
        holes = not bool(prompt_mask.all())
        if L > 1:
            self.state.forward(prompt_ids[:, :-1], prompt_mask[:, :-1], has_holes=holes, logits_to_keep=1)
            self.forwards += 1
        self.pending = prompt_ids[:, -1:]  # [B, 1]
        self.pending_valid = torch.ones_like(self.pending, dtype=torch.bool)
        self.pending_holes = False

    @torch.inference_mode()
    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        tokens, probs = [], []
        inp, valid, holes = self.pending, self.pending_valid, self.pending_holes
        self.mark = None
        for j in range(k):
            logits, _ = self.state.forward(inp, valid, has_holes=holes)
            self.forwards += 1
            if j == 0:
                self.mark = self.state.num_slots  # slots after the pending block hold d_1..d_{K-1}
            q = sampling.probs(as_float(logits[:, -1]))  # [B, V]
            tok = self.pick(q, sampling, generator)  # [B]
            tokens.append(tok)
            probs.append(q)
            inp, valid, holes = tok[:, None], None, False
        self.last_tokens = torch.stack(tokens, 1)  # [B, K]
        return self.last_tokens, torch.stack(probs, 1)  # [B, K], [B, K, V]

    @staticmethod
    def pick(q: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
        """Draw each row's draft token from its law ``q [B, V]`` (the argmax of a one-hot q when greedy)."""
        return q.argmax(-1) if sampling.greedy else sample_from_probs(q, generator)

    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        k = self.last_tokens.shape[1]
        n = num_accepted.tolist()
        self.state.rollback(self.mark, [min(x, k - 1) for x in n])
        full = [x == k for x in n]
        B = len(n)
        if any(full):
            rows = torch.arange(B, device=next_token.device)
            first = self.last_tokens[rows, k - 1]  # [B] d_K (used only where all K passed)
            self.pending = torch.stack([first, next_token], 1)  # [B, 2]
            self.pending_valid = torch.tensor([[f, True] for f in full], device=next_token.device)
            self.pending_holes = not all(full)
        else:
            self.pending = next_token[:, None]  # [B, 1]
            self.pending_valid = torch.ones_like(self.pending, dtype=torch.bool)
            self.pending_holes = False


    # ------------------------------------------------------------------ token trees (tree/, batch size 1)

    @torch.inference_mode()
    def tree_expand(self, tree, nodes: list[int]) -> torch.Tensor:
        """Draft logits ``[len(nodes), V]`` after each of ``nodes`` of a tree being built.

        ``[0]`` (the root) feeds the pending block (the root is its last token); later levels
        feed their nodes in one forward where each sees the committed prefix, its ancestors'
        slots and itself (:meth:`SlotCache.forward_tree`), at position root + depth."""
        if self.state.valid.shape[0] != 1:
            raise ValueError("tree drafting supports batch size 1 only")
        if nodes == [0]:
            logits, _ = self.state.forward(self.pending, self.pending_valid, has_holes=self.pending_holes)
            self.forwards += 1
            self.tree_mark = self.state.num_slots  # tree nodes' slots start here
            self.tree_root_pos = int(self.state.lengths[0]) - 1
            self.tree_slots: dict[int, int] = {}  # build-time node id -> slot offset from tree_mark
            return logits[0, -1:]  # [1, V]
        fed, n = len(self.tree_slots), len(nodes)
        visible = torch.zeros(n, fed + n, dtype=torch.bool)  # [n, fed + n]
        for i, v in enumerate(nodes):
            for a in tree.ancestors(tree.parents[v]):
                visible[i, self.tree_slots[tree.source[a]]] = True  # KeyError: an ancestor was never fed
        dev = self.pending.device
        tokens = torch.tensor([[tree.tokens[v] for v in nodes]], dtype=torch.long, device=dev)  # [1, n]
        positions = torch.tensor([[self.tree_root_pos + tree.depths[v] for v in nodes]], device=dev)  # [1, n]
        logits, _ = self.state.forward_tree(tokens, self.tree_mark, visible[None].to(dev), positions)  # [1, n, V]
        self.forwards += 1
        for i, v in enumerate(nodes):
            self.tree_slots[tree.source[v]] = fed + i
        return logits[0]

    def commit_tree(self, tree, path: list[int], next_token: int, target_hidden: torch.Tensor | None = None) -> None:
        """Keep the accepted path's fed nodes (compacted to contiguous slots), drop the rest; the
        path's unfed tail (at most its last node) and ``next_token`` become the pending block."""
        keep = [self.tree_slots[tree.source[a]] for a in path if tree.source[a] in self.tree_slots]
        self.state.compact(self.tree_mark, [keep])
        dev = self.pending.device
        self.pending = torch.tensor([[tree.tokens[a] for a in path[len(keep):]] + [int(next_token)]], device=dev)  # [1, P]
        self.pending_valid = torch.ones_like(self.pending, dtype=torch.bool)
        self.pending_holes = False
