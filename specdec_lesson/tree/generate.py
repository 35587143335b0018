"""Tree speculative decoding on Hugging Face models (batch size 1): :func:`tree_generate`."""

from __future__ import annotations

import torch

from ..drafters import ModelDrafter
from ..drafters.base import hidden_request
from ..generation import Clock, Outputs, blame, check_run, eos_of, prepare_inputs
from ..lean import make_cache
from ..models import check_same_vocab
from ..sampling import SamplingConfig, as_float, greedy_tokens
from ..stats import SpecStats
from .adaptive import AdaptiveTree
from .hybrid import HybridTree, HybridTreeDrafter
from .structure import DynamicTree, StaticTree, build_tree, expand_of
from .verify import RULES, verify_tree, verify_tree_greedy

__all__ = ["tree_generate"]

_DEFAULT_TREE = StaticTree()  # a frozen dataclass: safe as a shared default
# ------------------------------------------------------------------ the engine (batch size 1)


def _tree_drafter(draft):
    if isinstance(draft, ModelDrafter):
        return draft
    if hasattr(draft, "tree_expand") and hasattr(draft, "commit_tree"):
        return draft  # any drafter with the tree methods (e.g. a feature-level drafter)
    if isinstance(draft, torch.nn.Module):
        return None
    raise ValueError(f"tree drafting needs a causal LM or a drafter with tree_expand/commit_tree, got {type(draft).__name__}")


@torch.inference_mode()
def tree_generate(
    target: torch.nn.Module, draft, input_ids, max_new_tokens: int, tree: StaticTree | DynamicTree | HybridTree = _DEFAULT_TREE,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None, *,
    eos_token_id=None, attention_mask=None, paged: bool = False, rule: str | None = None, use_kernels: bool | None = None,
    lean: bool | None = None,
) -> tuple[list[torch.Tensor], SpecStats]:
    """Speculative decoding with a token tree per step, exact in distribution (batch size 1).

    ``draft``: a causal LM sharing the target's vocabulary (drafted through a
    :class:`~specdec_lesson.drafters.ModelDrafter`, level by level with the tree mask) or a
    drafter with ``tree_expand`` / ``commit_tree``.  ``tree``: a :class:`StaticTree`, a
    :class:`DynamicTree` or a :class:`~specdec_lesson.tree.hybrid.HybridTree` (the draft's tree plus a lookup
    continuation: ``draft`` is then wrapped in a prompt-lookup :class:`HybridTreeDrafter` unless it is one).
    ``rule`` overrides the tree's sibling rule (teaching only: a wrong rule is biased).  Returns per-row new
    tokens and a :class:`SpecStats` whose ``k`` is the tree's maximum depth, ``accept_hist`` counts accepted (and
    emitted) depths 0..k, ``alpha`` is accepted / (accepted + steps that ended in a rejection of every child), and
    ``tau`` is tokens per target forward.  Batches of more than one prompt raise ValueError (trees are B = 1 here).
    ``use_kernels``: KV compaction by the Triton kernel (default: on when CUDA and triton are present).
    ``lean``: the lean forward for a supported Llama target and model draft (:func:`specdec_lesson.lean.make_cache`;
    None: ``LEAN_BY_DEFAULT``)."""
    if not isinstance(tree, (StaticTree, DynamicTree, HybridTree, AdaptiveTree)):
        raise ValueError(f"tree must be a StaticTree, a DynamicTree, a HybridTree or an AdaptiveTree, got {type(tree).__name__}")
    if rule is not None and (not isinstance(rule, str) or rule not in RULES):
        raise ValueError(f"rule must be None (the tree's own sibling rule) or one of {RULES}, got {rule!r}")
    sampling = SamplingConfig(temperature, top_k, top_p)
    device = next(target.parameters()).device
    ids, mask = prepare_inputs(input_ids, attention_mask, device)
    if ids.shape[0] != 1:
        raise ValueError(f"tree_generate decodes one prompt at a time (batch size 1), got {ids.shape[0]} prompts")
    check_run(target, ids, max_new_tokens, tree.max_depth + 1)
    drafter = _tree_drafter(draft)
    if drafter is None:
        check_same_vocab(target, draft)
        drafter = ModelDrafter(draft, paged=paged, lean=lean)
    grafts = isinstance(tree, (HybridTree, AdaptiveTree))
    if grafts and not isinstance(drafter, HybridTreeDrafter):
        drafter = HybridTreeDrafter(drafter)  # prompt lookup beside the draft
    elif isinstance(drafter, HybridTreeDrafter) and not grafts:
        raise ValueError("a HybridTreeDrafter drafts a HybridTree or an AdaptiveTree: pass tree=HybridTree(...)")
    need_hidden = hidden_request(drafter)

    clock, stats = Clock(device), SpecStats(k=tree.max_depth)
    out = Outputs(1, max_new_tokens, eos_of(target, eos_token_id))
    forwards0 = drafter.forwards
    t0 = clock()
    state = make_cache(target, 1, device, lean=lean, paged=paged, use_kernels=use_kernels,  # Triton compaction on CUDA
                       capacity=ids.shape[1] + max_new_tokens + tree.max_nodes + 1)  # + one tree's nodes
    hidden = None
    if ids.shape[1] > 1:
        _, hidden = state.forward(ids[:, :-1], mask[:, :-1], has_holes=not bool(mask.all()), output_hidden=need_hidden,
                                  logits_to_keep=1)  # the prompt's logits are never read: one row of the output layer
        stats.target_forwards += 1
    drafter.begin(ids, mask, hidden)
    pending = int(ids[0, -1])
    stats.time_prefill = clock() - t0
    step = 0
    while not out.all_done:
        t1 = clock()
        step += 1
        with blame("draft", step):  # NaN draft logits raise, naming the draft
            if grafts:
                tr = drafter.build(tree, pending, sampling, generator)
            else:
                tr = build_tree(tree, pending, expand_of(drafter), sampling, generator)
        t2 = clock()
        since, root_pos = state.num_slots, int(state.lengths[0])
        tokens = torch.tensor([tr.tokens], dtype=torch.long, device=device)  # [1, N]
        logits, hidden = state.forward(tokens, block_mask=tr.mask(device)[None], positions=tr.positions(root_pos, device)[None],
                                       output_hidden=need_hidden)  # [1, N, V]
        stats.target_forwards += 1
        if sampling.greedy:
            path, nxt = verify_tree_greedy(tr, greedy_tokens(logits[0], "target", step).tolist())  # NaN logits raise
        else:
            path, nxt = verify_tree(tr, sampling.probs(as_float(logits[0]), "target", step), generator, rule)  # [N, V] laws
        t3 = clock()
        emitted = out.emit(0, tr.path_tokens(path[-1]) + [nxt] if path else [nxt])
        end = path[-1] if path else 0  # a path ending at a leaf saw no rejection (its bonus token is drawn from p)
        stats.record([len(path)], [emitted], [True], k_step=tree.max_depth, rejected=[bool(tr.children[end])])
        state.compact(since, [[0] + path])  # root + accepted nodes, now contiguous
        if not out.all_done:
            drafter.commit_tree(tr, path, nxt, hidden)
        pending = nxt
        stats.time_draft += t2 - t1
        stats.time_verify += t3 - t2
        stats.time_other += clock() - t3
    stats.draft_forwards = drafter.forwards - forwards0
    return out.tensors(device), stats
