"""Toy "language models" whose output laws can be enumerated exactly.

A :class:`MarkovLM` of order m draws the next token from a rational law that depends on the
last m tokens.  Three things are built on it:

* :func:`process_law`: temperature / top-k / top-p on a law of ``Fraction``s, the exact twin of
  :func:`specdec_lesson.sampling.logits_to_probs`.  Temperatures are restricted to 0 and 1/m
  (m = 1, 2, ...): softmax(log p / T) = p^(1/T) / sum p^(1/T), which is rational only when
  1/T is an integer (T = 1/2 squares the law and renormalises; T = 2 would need square roots).
* :func:`target_joint` and :func:`speculative_joint`: the exact joint law (``Fraction``s) of the
  first n emitted tokens of plain sampling and of speculative chain decoding (K drafts,
  accept / residual / bonus, continuing across steps).  Losslessness is then an *equality*.
* :func:`sample_speculative`: the same decoding with torch tensors and an explicit generator,
  many independent chains at once as a batch, driving the real :func:`verify_chain` (or any rule
  with its signature, e.g. :func:`specdec_lesson.verify.block.verify_block`).

:mod:`specdec_lesson.toy_block` enumerates a step under any verification rule (token-level or
block verification) from the rule's exact outcome law, with the same :func:`compose_steps`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import cache

import torch

from .sampling import SamplingConfig, check_sampling_args, sample_from_probs
from .stats import chi_square_test, tv_distance
from .verify import verify_chain

__all__ = [
    "MarkovLM", "random_markov", "process_law", "target_joint", "speculative_step_law",
    "speculative_joint", "draft_step", "sample_target", "sample_speculative", "counts_of", "mc_joint_check",
]

Law = tuple[Fraction, ...]


class MarkovLM:
    """Next-token law = ``table[last `order` tokens]``, a tuple of ``vocab`` Fractions summing to 1."""

    def __init__(self, table: dict[tuple[int, ...], Sequence], vocab: int, order: int = 1) -> None:
        if order < 1 or vocab < 1:
            raise ValueError(f"order and vocab must be >= 1, got order={order}, vocab={vocab}")
        self.vocab, self.order = vocab, order
        self.table: dict[tuple[int, ...], Law] = {}
        for ctx, law in table.items():
            law = tuple(Fraction(v) for v in law)
            if len(ctx) != order or len(law) != vocab or sum(law) != 1 or min(law) < 0:
                raise ValueError(f"table[{ctx}] must be a law over {vocab} tokens for a context of {order} tokens")
            self.table[tuple(ctx)] = law
        missing = [c for c in _contexts(vocab, order) if c not in self.table]
        if missing:
            raise ValueError(f"table lacks contexts, e.g. {missing[0]}")
        laws = [[float(v) for v in self.table[c]] for c in _contexts(vocab, order)]
        self.probs_table = torch.tensor(laws, dtype=torch.float64).reshape(*([vocab] * order), vocab)  # [V]*order + [V]

    def next_law(self, context: Sequence[int]) -> Law:
        """The exact law of the next token after ``context`` (at least ``order`` tokens)."""
        if len(context) < self.order:
            raise ValueError(f"context needs at least {self.order} tokens, got {len(context)}")
        return self.table[tuple(context[-self.order:])]

    def logits(self, contexts: torch.Tensor) -> torch.Tensor:
        """``contexts [..., >= order]`` (int64) -> log-probabilities ``[..., V]`` (float64).

        Zero probabilities become -1e30 instead of -inf, so that ``logits_to_probs`` (which
        rejects non-finite logits) maps them back to exactly 0 at every temperature."""
        last = contexts[..., -self.order:]  # [..., order]
        probs = self.probs_table[tuple(last[..., j] for j in range(self.order))]  # [..., V]
        return torch.log(probs).clamp_min(-1e30)


def _contexts(vocab: int, order: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for _ in range(order):
        out = [c + (t,) for c in out for t in range(vocab)]
    return out


def random_markov(vocab: int = 3, order: int = 1, seed: int = 0, low: int = 1, high: int = 9) -> MarkovLM:
    """A Markov LM with laws proportional to random integers in [low, high] (low = 0 allows zeros)."""
    rng = random.Random(seed)
    table = {}
    for ctx in _contexts(vocab, order):
        w = [rng.randint(low, high) for _ in range(vocab)]
        if sum(w) == 0:
            w[rng.randrange(vocab)] = 1
        table[ctx] = [Fraction(v, sum(w)) for v in w]
    return MarkovLM(table, vocab, order)


def _exact_temperature(temperature) -> int:
    """0 -> 0 (greedy); 1/m -> m; anything else raises (the law would be irrational)."""
    t = Fraction(temperature).limit_denominator(10**6) if isinstance(temperature, float) else Fraction(temperature)
    if t == 0:
        return 0
    if t < 0 or t.numerator != 1:
        raise ValueError(f"exact processing needs temperature 0 or 1/m for an integer m >= 1, got {temperature!r}")
    return t.denominator


def process_law(law: Sequence, temperature=1, top_k: int | None = None, top_p=None) -> Law:
    """Exact twin of ``logits_to_probs(log(law), temperature, top_k, top_p)`` on Fractions.

    Same rules: T = 0 is one-hot on the first argmax; T = 1/m raises the law to the power m;
    top-k keeps every token >= the k-th largest (ties kept); top-p sorts descending (ties by
    lower id first, as a stable sort) and keeps a token while the mass before it is < top_p.
    A float ``top_p`` is read as the decimal it prints as (0.8 -> 4/5).  At an exact boundary
    (mass before a token == top_p, e.g. 1/2 + 3/10 against 0.8) torch's float cumsum may round
    either way, so tests pick laws and top_p values away from such ties.
    """
    check_sampling_args(float(temperature), top_k, None if top_p is None else float(top_p))
    law = [Fraction(v) for v in law]
    m = _exact_temperature(temperature)
    if m == 0:
        best = max(range(len(law)), key=lambda i: (law[i], -i))
        return tuple(Fraction(int(i == best)) for i in range(len(law)))
    w = [v**m for v in law]
    if top_k is not None and top_k < len(w):
        kth = sorted(w, reverse=True)[top_k - 1]
        w = [v if v >= kth else Fraction(0) for v in w]
    total = sum(w)
    w = [v / total for v in w]
    top_p = None if top_p is None else Fraction(str(top_p)) if isinstance(top_p, float) else Fraction(top_p)
    if top_p is not None and top_p < 1:
        keep, before = [False] * len(w), Fraction(0)
        for rank, i in enumerate(sorted(range(len(w)), key=lambda i: (-w[i], i))):
            keep[i] = rank == 0 or before < top_p
            before += w[i]
        total = sum(v for v, k in zip(w, keep) if k)
        w = [v / total if k else Fraction(0) for v, k in zip(w, keep)]
    return tuple(w)


def target_joint(model: MarkovLM, prompt: Sequence[int], n: int, temperature=1, top_k=None, top_p=None) -> dict:
    """Exact law of the first ``n`` tokens the model samples after ``prompt``: {tuple: Fraction}."""
    out: dict[tuple[int, ...], Fraction] = {(): Fraction(1)}
    for _ in range(n):
        nxt: dict[tuple[int, ...], Fraction] = {}
        for seq, w in out.items():
            law = process_law(model.next_law(tuple(prompt) + seq), temperature, top_k, top_p)
            for tok, pt in enumerate(law):
                if pt:
                    nxt[seq + (tok,)] = w * pt
        out = nxt
    return out


def speculative_step_law(target: MarkovLM, draft: MarkovLM, context: Sequence[int], k: int, horizon: int,
                         temperature=1, top_k=None, top_p=None, *, bonus: bool = True) -> dict:
    """Exact law of the block of tokens ONE speculative step emits after ``context``.

    Literally Leviathan's Algorithm 1 on Fractions: draft d_1..d_K from the processed q, accept
    d_i with probability min(1, p_i(d_i)/q_i(d_i)), at the first rejection emit from
    max(0, p_i - q_i) normalised, after K acceptances emit the bonus from p_K (``bonus=False``:
    emit nothing then - the efficiency bug of :mod:`specdec_lesson.pitfalls`).

    ``horizon``: only the first ``horizon`` emitted tokens matter to the caller, so once
    ``horizon`` drafts are accepted the later drafts and outcomes are summed out (their
    probabilities add up to 1); this keeps the enumeration small without changing the law.
    """
    proc = lambda law: process_law(law, temperature, top_k, top_p)  # noqa: E731
    ctx0 = tuple(context)
    out: dict[tuple[int, ...], Fraction] = {}

    def add(block: tuple[int, ...], w: Fraction) -> None:
        out[block] = out.get(block, Fraction(0)) + w

    def walk(drafted: tuple[int, ...], w: Fraction) -> None:
        if len(drafted) == horizon:
            return add(drafted, w)
        p = proc(target.next_law(ctx0 + drafted))
        if len(drafted) == k:
            if not bonus:
                return add(drafted, w)
            for y, py in enumerate(p):
                if py:
                    add(drafted + (y,), w * py)
            return
        q = proc(draft.next_law(ctx0 + drafted))
        residual = [max(Fraction(0), a - b) for a, b in zip(p, q)]
        z = sum(residual)
        for x, qx in enumerate(q):
            if not qx:
                continue
            acc = min(Fraction(1), p[x] / qx)
            if acc:
                walk(drafted + (x,), w * qx * acc)
            if acc < 1:  # rejection implies p(x) < q(x), hence z > 0
                for y, r in enumerate(residual):
                    if r:
                        add(drafted + (y,), w * qx * (1 - acc) * r / z)

    walk((), Fraction(1))
    return out


def speculative_joint(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, k: int,
                      temperature=1, top_k=None, top_p=None, *, bonus: bool = True) -> dict:
    """Exact law of the first ``n`` tokens emitted by speculative chain decoding (steps repeat
    from the extended context until n tokens are out): {tuple: Fraction}."""
    if k < 1 or n < 1:
        raise ValueError(f"k and n must be >= 1, got k={k}, n={n}")

    @cache
    def step(context: tuple[int, ...], horizon: int) -> dict:
        return speculative_step_law(target, draft, context, k, horizon, temperature, top_k, top_p, bonus=bonus)

    return compose_steps(step, prompt, n)


def compose_steps(step, prompt: Sequence[int], n: int) -> dict:
    """Joint law of the first ``n`` emitted tokens when each step, from ``context``, emits a block
    of tokens with law ``step(context, horizon) -> {block: Fraction}``: {tuple: Fraction}."""
    out: dict[tuple[int, ...], Fraction] = {}

    def go(emitted: tuple[int, ...], w: Fraction) -> None:
        if len(emitted) >= n:
            out[emitted[:n]] = out.get(emitted[:n], Fraction(0)) + w
            return
        for block, pb in step(tuple(prompt) + emitted, n - len(emitted)).items():
            go(emitted + block, w * pb)

    go((), Fraction(1))
    return out


# ------------------------------------------------------------------ torch + generator sampling

DraftStep = Callable[[torch.Tensor, SamplingConfig, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def draft_step(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The correct draft step: q = the processed law, token ~ q.  ``logits [B, V]`` -> ``([B], [B, V])``."""
    q = sampling.probs(logits)  # [B, V]
    return sample_from_probs(q, generator), q


def sample_target(model: MarkovLM, prompt: Sequence[int], n: int, batch: int, generator: torch.Generator,
                  temperature: float = 1.0, top_k=None, top_p=None) -> torch.Tensor:
    """``batch`` independent plain samples of the first ``n`` tokens: ``[batch, n]``."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    seq = torch.tensor(list(prompt), dtype=torch.long).expand(batch, -1)  # [B, L]
    for _ in range(n):
        tok = sample_from_probs(sampling.probs(model.logits(seq)), generator)  # [B]
        seq = torch.cat([seq, tok[:, None]], dim=1)
    return seq[:, len(prompt):]


def sample_speculative(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, k: int, batch: int,
                       generator: torch.Generator, temperature: float = 1.0, top_k=None, top_p=None, *,
                       draft_fn: DraftStep = draft_step, verify_fn: Callable = verify_chain) -> torch.Tensor:
    """``batch`` independent speculative chains, each run until ``n`` tokens are emitted: ``[batch, n]``.

    One loop iteration is one speculative step for every row: K draft steps (``draft_fn``),
    the target's processed laws at the K+1 positions, then ``verify_fn(target_probs,
    draft_probs, draft_tokens, generator) -> (num_accepted, next_token)``; a negative
    next_token means "no token" (used by the dropped-bonus pitfall).
    """
    sampling = SamplingConfig(temperature, top_k, top_p)
    L0 = len(prompt)
    width = L0 + n + k + 1
    hist = torch.zeros(batch, width, dtype=torch.long)  # [B, W]
    hist[:, :L0] = torch.tensor(list(prompt), dtype=torch.long)
    length = torch.full((batch,), L0, dtype=torch.long)  # [B]
    rows = torch.arange(batch)
    m = max(target.order, draft.order)
    if L0 < m or k < 1 or n < 1:
        raise ValueError(f"need a prompt of >= {m} tokens, k >= 1 and n >= 1; got {L0}, k={k}, n={n}")
    offs = torch.arange(-m, 0)  # [m]
    while bool((length < L0 + n).any()):
        ctx = hist.gather(1, (length[:, None] + offs).clamp_min(0))  # [B, m] last m tokens
        seq = ctx
        drafts, qs = [], []
        for _ in range(k):
            tok, q = draft_fn(draft.logits(seq), sampling, generator)  # [B], [B, V]
            drafts.append(tok)
            qs.append(q)
            seq = torch.cat([seq, tok[:, None]], dim=1)
        draft_tokens = torch.stack(drafts, dim=1)  # [B, K]
        draft_probs = torch.stack(qs, dim=1)  # [B, K, V]
        windows = seq.unfold(1, m, 1)  # [B, K+1, m] context of each verified position
        target_probs = sampling.probs(target.logits(windows))  # [B, K+1, V]
        num_accepted, next_token = verify_fn(target_probs, draft_probs, draft_tokens, generator)
        block = torch.cat([draft_tokens, torch.zeros(batch, 1, dtype=torch.long)], dim=1)  # [B, K+1]
        block[rows, num_accepted] = next_token.clamp_min(0)
        block_len = num_accepted + (next_token >= 0).long()  # [B]
        active = length < L0 + n  # [B]
        j = torch.arange(k + 1)
        write = active[:, None] & (j[None, :] < block_len[:, None])  # [B, K+1]
        pos = (length[:, None] + j).clamp(max=width - 1)  # [B, K+1]
        hist.scatter_(1, pos, torch.where(write, block, hist.gather(1, pos)))
        length = torch.where(active, length + block_len, length)
    return hist[:, L0:L0 + n]


def counts_of(samples: torch.Tensor) -> dict:
    """``samples [N, n]`` -> {tuple of n tokens: count} (one host transfer)."""
    counts: dict[tuple[int, ...], int] = {}
    for row in samples.tolist():
        t = tuple(row)
        counts[t] = counts.get(t, 0) + 1
    return counts


def mc_joint_check(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, k: int, batch: int,
                   generator: torch.Generator, temperature: float = 1.0, top_k=None, top_p=None, **harness) -> dict:
    """Monte Carlo check of speculative decoding against the target's exact joint law.

    Runs :func:`sample_speculative` (``harness`` may swap ``draft_fn`` / ``verify_fn``) for
    ``batch`` chains and returns the Pearson chi-square ``stat``, ``dof``, ``p_value`` against
    :func:`target_joint` (with the same processing), the empirical ``tv``, and the ``counts``.
    """
    exact = target_joint(target, prompt, n, Fraction(temperature).limit_denominator(1000), top_k, top_p)
    law = {key: float(v) for key, v in exact.items()}
    samples = sample_speculative(target, draft, prompt, n, k, batch, generator, temperature, top_k, top_p, **harness)
    counts = counts_of(samples)
    stat, dof, p_value = chi_square_test(counts, law)
    tv = tv_distance({key: c / batch for key, c in counts.items()}, law)
    return {"stat": stat, "dof": dof, "p_value": p_value, "tv": tv, "counts": counts, "law": law}
