"""An EAGLE-style feature-level draft for the default target, and its ``Drafter`` (``eagle3``: the EAGLE-3 variant).

The draft predicts the target's next *feature* (last hidden state after the final norm, f_t; Li et al., EAGLE,
2024).  At position t its input is ``fc([f_t ; e(x_{t+1})])`` (the target's feature and its frozen embedding of the
next token), then ONE Llama decoder layer (GQA and RoPE like the target) and a norm give ``g_t ~ f_{t+1}``; the
logits for x_{t+2} are ``g_t @ E_sub.T``: the target's tied output layer on the N most frequent teacher tokens
(``d2t`` maps them back).  Past the verified prefix the draft feeds its own predicted features; training unrolls
those steps ("training-time test": step s at position t sees the true-feature keys up to t-s+1 and its own earlier
predicted keys).  The law q handed to the engine is the full-vocabulary law after the run's SAME
``SamplingConfig.probs``: logits are -inf outside the subset (q = 0 there, exactly the law it samples from);
greedy runs return ``None`` (a one-hot q).  The network itself (``EagleConfig``, ``EagleDraft``, training) is in
:mod:`.eagle_model`; this module holds the engine's view of it and its files.

Per draft step the drafter pays little besides the draft's five matrix products and its output rows: RoPE's cos / sin
are tables over every cache slot (indexed, not recomputed), a one-token step of a batch-of-one run without holes
attends to every slot up to its own without a mask, and trees take the top-k of the run's output subset without
building full-vocabulary logits (:class:`~specdec_lesson.sampling.SubsetLogits`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..fastcpu import _pack, _packed_linear, count_packed, prepack_linears, set_plain_rows
from ..sampling import SamplingConfig, SubsetLogits, as_float, check_logits, sample_from_probs
from .base import Drafter
from .eagle_model import EagleConfig, EagleDraft, _rms, _rotate  # noqa: F401 (re-exported)

__all__ = ["EagleConfig", "EagleDraft", "EagleDrafter", "load_default_draft", "DEFAULT_DRAFT_DIR"]

DEFAULT_DRAFT_DIR = Path(__file__).parent.parent / "data"
DEFAULT_DRAFT_NAME = "eagle_smollm2"


class EagleDrafter(Drafter):
    """The engine's view of an ``EagleDraft``: a one-layer KV cache with per-row lengths and slot validity
    (ragged rows simply write at different slots), rolled back on rejection by invalidating slots."""

    needs_target_hidden = True
    accepts_foreign_proposals = True  # commit re-feeds the accepted tokens: any proposal source works (drafters/hybrid.py)
    default_k = 4  # K sweep (ksweep_default_t0.json): K = 2..5 within noise for the hybrid, K = 2..3 best for the draft alone
    keep_drafting = None  # optional stop rule (drafters.adaptive): (j, confidence [B]) -> bool, asked before draft j+1

    def __init__(self, model: EagleDraft, *, add_prompt_tokens: bool = True, dispatch_like=None) -> None:
        """``dispatch_like``: a target with pre-packed linears (``fastcpu``; ``fast=True``): the draft's linears and output
        rows are pre-packed too, each width routed as the target's engine forward (``lean.path.engine_plain_rows``);
        plain one-row products cost twice the packed ones on some CPUs (the AMD Zen 5 probe in bench_default_t0_zen5.json)."""
        self.model = model.eval()
        self.forwards = 0
        self.V = model.embed.shape[0]
        self.add_prompt_tokens = add_prompt_tokens
        self.target_hidden_layers = model.target_hidden_layers  # which target hidden states the engine passes
        self.plain_rows, self.head_packed = 0, None  # set per run by begin() when packed
        self.dispatch_like = dispatch_like if dispatch_like is not None and count_packed(dispatch_like) else None
        if self.dispatch_like is not None:
            prepack_linears(self.model)  # in place; a no-op without the oneDNN path or off fp32 CPU

    def _ensure(self, need: int) -> None:
        S = self.k_cache.shape[2]
        if need > S:
            grow = max(need, 2 * S) - S
            self.k_cache = F.pad(self.k_cache, (0, 0, 0, grow))
            self.v_cache = F.pad(self.v_cache, (0, 0, 0, grow))
            self.valid = F.pad(self.valid, (0, grow))
        if self.cos.shape[0] < self.k_cache.shape[2]:
            self._rope_tables(self.k_cache.shape[2])

    def _rope_tables(self, size: int) -> None:
        """cos / sin ``[size, hd]`` at slot positions 0..size-1, as ``EagleDraft.rope`` computes them per step."""
        cos, sin = self.model.rope(torch.arange(size, device=self.model.inv_freq.device))  # [1, size, hd] each
        self.cos, self.sin = cos[0], sin[0]

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, M] (< the cache's slots) -> cos, sin [B, 1, M, hd], rows of the tables."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def _step(self, feats: torch.Tensor, tokens: torch.Tensor, write_valid: torch.Tensor) -> torch.Tensor:
        """Feed feats [B, M, H], tokens [B, M] at slots lengths+pos..; returns g [B, M, H]."""
        m = self.model
        B, M = tokens.shape
        slots = self.cursor[:, None] + torch.arange(M, device=tokens.device)  # [B, M]
        S = int(slots.max()) + 1  # one host sync per draft step; slots past every row's last write are never visible
        self._ensure(S)
        cos, sin = self._rope(slots)  # [B, 1, M, hd]
        x, q, k, v = m.qkv_of(feats, tokens, cos, sin)
        idx = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])  # [B, nkv, M, hd]
        self.k_cache.scatter_(2, idx, k)
        self.v_cache.scatter_(2, idx, v)
        self.valid.scatter_(1, slots, write_valid)
        see = None  # one token of a run without holes (B = 1) sees every slot up to its own: no mask
        if M > 1 or not self.dense:
            see = self.valid[:, None, :S] & (torch.arange(S, device=tokens.device)[None, None, :] <= slots[:, :, None])
            see = see[:, None]  # [B, 1, M, S]
        attn = F.scaled_dot_product_attention(q, self.k_cache[:, :, :S], self.v_cache[:, :, :S], attn_mask=see,
                                              enable_gqa=True)  # [B, nh, M, hd]
        self.forwards += 1
        return m.finish(x, attn)  # [B, M, H]

    @torch.inference_mode()
    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        m = self.model
        if self.dispatch_like is not None:
            from ..lean.path import engine_plain_rows

            self.plain_rows = engine_plain_rows(self.dispatch_like)
            set_plain_rows(m, self.plain_rows)
        B, L = prompt_ids.shape
        c, dev, dt = m.cfg, prompt_ids.device, m.head.dtype
        self.k_cache = torch.zeros(B, c["kv_heads"], max(64, 2 * L), c["head_dim"], device=dev, dtype=dt)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.valid = torch.zeros(B, self.k_cache.shape[2], dtype=torch.bool, device=dev)
        self.cursor = torch.zeros(B, dtype=torch.long, device=dev)  # committed slots per row
        self._rope_tables(self.k_cache.shape[2])
        # one row, no padding: every slot below a row's write position holds a committed or tentative token (commit
        # rolls back every slot past the cursor, then writes the accepted ones contiguously)
        self.dense = B == 1 and bool(prompt_mask.bool().all())
        # the draft's vocabulary for this run: the shipped subset plus the prompts' own tokens (answers copy names and
        # identifiers from the prompt); sorted, so argmax ties resolve to the lowest id as in logits_to_probs
        self.d2t = m.d2t
        if self.add_prompt_tokens:
            self.d2t = torch.unique(torch.cat([m.d2t, prompt_ids[prompt_mask.bool()].long()]))  # [N']
        self.head = m.out_embed[self.d2t].to(dt) if len(self.d2t) != len(m.d2t) else m.head  # [N', H]
        self.head_packed = None
        if self.dispatch_like is not None and count_packed(m) and dt == torch.float32:
            self.head_packed = _pack(self.head)  # oneDNN's blocked copy of this run's output rows (about a ms)
        if L > 1:
            feats = m.embed_features(target_hidden.to(dt))  # [B, L-1, H]
            g = self._step(feats, prompt_ids[:, 1:], prompt_mask[:, :-1].bool())  # [B, L-1, H]
            self.g_last = g[:, -1]  # [B, H] ~ feature of the pending token's position
            self.cursor += L - 1
        else:
            self.g_last = torch.zeros(B, c["hidden"], device=dev, dtype=dt)

    def _sub_logits(self, g: torch.Tensor) -> torch.Tensor:
        """g [M, H] -> logits [M, N'] on this run's output subset ``d2t``, in fp32 (fp64 for fp64)."""
        f = self.model.out_features(g)  # [M, H]
        if self.head_packed is not None and f.shape[0] > self.plain_rows:  # packed only for an fp32 draft (begin)
            return _packed_linear(f, self.head_packed, None)  # [M, N'] the same product, oneDNN's summation order
        return as_float(f @ self.head.T)  # [M, N']: a law to fp32 rounding

    def _law(self, g: torch.Tensor, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
        sub = self._sub_logits(g)  # [B, N']
        if sampling.greedy:
            check_logits(sub)  # NaN logits raise (argmax would pick garbage)
            if self.keep_drafting is not None:
                self.confidence = torch.softmax(sub, -1).amax(-1)  # [B] top probability of the draft's T = 1 law
            return self.d2t[sub.argmax(-1)], None  # one-hot q on the full-vocabulary argmax
        full = sub.new_full((g.shape[0], self.V), float("-inf")).index_copy_(1, self.d2t, sub)  # [B, V]
        q = sampling.probs(full)  # [B, V] fp32 / fp64; zero outside the subset
        if self.keep_drafting is not None:
            self.confidence = q.amax(-1)  # [B]
        return None, q

    @torch.inference_mode()
    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        tokens, probs = [], []
        g = self.g_last
        start = self.cursor.clone()
        for j in range(k):
            tok, q = self._law(g, sampling)
            if self.keep_drafting is not None and not self.keep_drafting(j, self.confidence):
                break  # decided from draft j+1's law alone, before it is drawn: the output law stays the target's
            if q is not None:
                tok = sample_from_probs(q, generator)  # [B] drawn from exactly the q we return
                probs.append(q)
            tokens.append(tok)
            if j < k - 1:  # the last draft is never fed
                g = self._step(g[:, None], tok[:, None], torch.ones_like(tok[:, None], dtype=torch.bool))[:, 0]
                self.cursor += 1
        self.cursor = start  # tentative slots stay valid until commit rolls them back
        self.last_tokens = torch.stack(tokens, 1) if tokens else self.cursor.new_zeros(len(start), 0)  # [B, K]
        return self.last_tokens, (torch.stack(probs, 1) if probs else None)  # [B, K], [B, K, V] or None

    def propose_foreign(self, tokens: torch.Tensor) -> None:
        """This step's proposal [B, K] came from elsewhere (``HybridDrafter``); commit feeds what was accepted."""
        self.last_tokens = tokens

    @torch.inference_mode()
    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        B, K = self.last_tokens.shape
        S = self.valid.shape[1]
        dev = next_token.device
        self.valid &= torch.arange(S, device=dev)[None, :] < self.cursor[:, None]  # roll back tentative slots
        M = int(num_accepted.max()) + 1
        j = torch.arange(M, device=dev)[None, :]  # [1, M]
        toks = torch.cat([self.last_tokens, next_token[:, None]], 1)[:, :M].clone()  # [B, M]
        toks = torch.where(j == num_accepted[:, None], next_token[:, None], toks)  # d_1..d_n, then next_token
        feats = self.model.embed_features(target_hidden[:, :M].to(self.model.head.dtype))  # [B, M, H] at pending, d_1..d_n
        g = self._step(feats, toks, j <= num_accepted[:, None])  # [B, M, H]
        self.g_last = g[torch.arange(B, device=dev), num_accepted]  # [B, H]
        self.cursor += num_accepted + 1
    # ------------------------------------------------------------------ token trees (tree/, batch size 1)

    def _full_logits(self, g: torch.Tensor) -> torch.Tensor:
        """g [M, H] -> full-vocabulary logits [M, V], -inf outside this run's subset (q = 0 there)."""
        return self._subset_logits(g).full()

    def _subset_logits(self, g: torch.Tensor) -> SubsetLogits:
        return SubsetLogits(self._sub_logits(g), self.d2t, self.V)  # [M, N'] on the run's subset

    @torch.inference_mode()
    def tree_expand(self, tree, nodes: list[int]) -> torch.Tensor:
        """Draft logits ``[len(nodes), V]`` after each of ``nodes`` of a token tree (B = 1); -inf outside the run's
        subset.  :meth:`tree_expand_subset` returns the same logits on the subset alone (what tree building uses)."""
        return self.tree_expand_subset(tree, nodes).full()

    @torch.inference_mode()
    def tree_expand_subset(self, tree, nodes: list[int]) -> SubsetLogits:
        """The draft's logits after each of ``nodes`` on this run's output subset (``SubsetLogits [len(nodes), N']``).

        The root's law comes from ``g_last``; a node v is fed as (its parent's predicted feature,
        v's token) at a tentative slot past the committed ones, at RoPE position cursor + depth - 1,
        seeing the committed slots, its ancestors' slots and itself (the tree mask)."""
        if self.valid.shape[0] != 1:
            raise ValueError("tree drafting supports batch size 1 only")
        if nodes == [0]:
            self.tree_g = {0: self.g_last[0]}  # build-time node id -> predicted feature [H]
            self.tree_slot: dict[int, int] = {}  # build-time node id -> cache slot
            return self._subset_logits(self.g_last)  # [1, N']
        m, dev = self.model, self.g_last.device
        cur, M = int(self.cursor[0]), len(nodes)
        first = cur + len(self.tree_slot)
        slot_list = list(range(first, first + M))
        S = first + M  # slots past the last one written are never visible
        self._ensure(S)
        rows, cols = [], []  # the tree part of the mask: each node sees its ancestors' slots and its own
        for i, v in enumerate(nodes):
            seen = [self.tree_slot[tree.source[a]] for a in tree.ancestors(tree.parents[v])] + [slot_list[i]]
            rows += [i] * len(seen)
            cols += seen
        see = (self.valid[0, :S] & (torch.arange(S, device=dev) < cur))[None, :].repeat(M, 1)  # [M, S] committed slots
        see[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = True
        feats = torch.stack([self.tree_g[tree.source[tree.parents[v]]] for v in nodes])[None]  # [1, M, H]
        tokens = torch.tensor([[tree.tokens[v] for v in nodes]], device=dev)  # [1, M]
        positions = torch.tensor([[cur + tree.depths[v] - 1 for v in nodes]], device=dev)  # [1, M]
        x, q, k, v_ = m.qkv_of(feats.to(m.head.dtype), tokens, *self._rope(positions))
        slots = torch.tensor(slot_list, device=dev)  # [M]
        self.k_cache[0][:, slots] = k[0]  # [nkv, M, hd]
        self.v_cache[0][:, slots] = v_[0]
        self.valid[0, slots] = True  # tentative: commit rolls back every slot >= cursor
        attn = F.scaled_dot_product_attention(q, self.k_cache[:, :, :S], self.v_cache[:, :, :S], attn_mask=see[None, None],
                                              enable_gqa=True)  # [1, nh, M, hd]
        self.forwards += 1
        g = m.finish(x, attn)[0]  # [M, H]
        for i, v in enumerate(nodes):
            self.tree_g[tree.source[v]] = g[i]
            self.tree_slot[tree.source[v]] = slot_list[i]
        return self._subset_logits(g)  # [M, N']

    def commit_tree(self, tree, path: list[int], next_token: int, target_hidden: torch.Tensor | None) -> None:
        """Commit the accepted path and ``next_token`` exactly as the chain ``commit`` does, with the
        target's features at the root and the path's nodes (rows ``[0] + path`` of the tree forward)."""
        dev = self.g_last.device
        self.last_tokens = torch.tensor([[tree.tokens[a] for a in path]], dtype=torch.long, device=dev)  # [1, n]
        rows = torch.tensor([0] + list(path), device=dev)
        self.commit(torch.tensor([len(path)], device=dev), torch.tensor([int(next_token)], device=dev), target_hidden[:, rows])


def _target_tables(target, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding [V, H], output embedding [V, H]) of the target."""
    return (target.get_input_embeddings().weight.detach().to(dtype), target.get_output_embeddings().weight.detach().to(dtype))


def save_draft(model: EagleDraft, folder: Path, name: str = DEFAULT_DRAFT_NAME, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: (v.half() if v.is_floating_point() else v.int()).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps({"config": dict(model.cfg), **(extra or {})}, indent=1))


DRAFT_CLASSES: dict[str, type[EagleDraft]] = {"eagle": EagleDraft}  # drafters.eagle3 adds "eagle3" on import


def draft_class(cfg: dict) -> type[EagleDraft]:
    """The draft class of a config's ``arch`` (``"eagle"`` when absent); ValueError naming an unknown one."""
    arch = cfg.get("arch", "eagle")
    if arch not in DRAFT_CLASSES:
        raise ValueError(f"unknown draft architecture {arch!r} in the draft's config (known: {', '.join(DRAFT_CLASSES)})")
    return DRAFT_CLASSES[arch]


def load_draft(target, folder: Path, name: str = DEFAULT_DRAFT_NAME, dtype=torch.float32) -> EagleDraft:
    from safetensors.torch import load_file

    if not (folder / f"{name}.safetensors").is_file() or not (folder / f"{name}.json").is_file():
        raise FileNotFoundError(f"no draft weights {name}.safetensors/.json in {folder}; build them with "
                                "python -m specdec_lesson.distill gen / train / export")
    meta = json.loads((folder / f"{name}.json").read_text())
    sd = load_file(str(folder / f"{name}.safetensors"))
    model = draft_class(meta["config"])(EagleConfig(meta["config"]), *_target_tables(target, dtype), d2t=sd["d2t"])
    model.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v.long()) for k, v in sd.items()})
    return model.to(dtype).eval()


def draft_identity(folder: Path = DEFAULT_DRAFT_DIR, name: str = DEFAULT_DRAFT_NAME) -> dict:
    """What names a draft in a benchmark's record: its weights' sha256 (first 16 hex digits), output subset and the
    training steps of its whole chain, so a result says which draft made it even after the shipped one changes."""
    import hashlib

    weights, meta = folder / f"{name}.safetensors", folder / f"{name}.json"
    if not weights.is_file() or not meta.is_file():
        return {"folder": str(folder), "missing": True}
    cfg = json.loads(meta.read_text())
    steps, t = 0, cfg.get("training") or {}
    while isinstance(t, dict) and t:  # each run records the run it started from under "init"
        steps, t = steps + int(t.get("steps", 0)), t.get("init")
    return {"sha256_16": hashlib.sha256(weights.read_bytes()).hexdigest()[:16], "n_sub": cfg["config"].get("n_sub"),
            "steps_total": steps}


def load_default_draft(target) -> EagleDrafter:
    """The shipped distilled draft for SmolLM2-135M-Instruct, as a Drafter for ``speculative_generate``."""
    return EagleDrafter(load_draft(target, DEFAULT_DRAFT_DIR), dispatch_like=target)
