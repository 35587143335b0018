"""``AdaptiveDrafter``: any drafter, proposing each step the K (0 = a plain step) that the run says pays most.

The arithmetic is :mod:`.adaptive_policy` (expected tokens per second from the run's acceptance per depth, the
draft's confidence and the measured :class:`~.adaptive_policy.StepCosts`); this module plugs it into the engine:

* a plain step (K = 0) costs exactly a target forward over one token: the draft does nothing.  A draft that
  takes foreign proposals (``EagleDrafter``) is not even fed: the tokens and target features of the plain (and
  lookup) steps wait in a buffer and are fed in ONE forward when drafting resumes (``catch_up`` in the costs),
  and it reads the prompt only when it first drafts, so a run that never drafts never pays the draft's prefill;
  any other draft keeps its state by drafting one token that is never proposed (its cost, ``draft_first``);
* a draft with a ``keep_drafting`` hook (``EagleDrafter``) drafts one token at a time: before each token is drawn
  the policy sees every row's confidence (the top probability of the draft's law there) and stops when the next
  token's expected gain per second is below the rate already secured; any other draft proposes the planned K and
  the same rule cuts the proposal, reading only the laws q, never the drawn tokens' values;
* a ``HybridDrafter`` is unpacked: its lookup proposes (free, one-hot) where every row's history repeats, the
  policy choosing how many of the lookup's tokens to verify; mixed rows take the lookup's tokens as it does;
* measured costs (:class:`StepTimes`): the cost model predicts each step's seconds, the run's own wall-clock times
  correct it, per kind of step (plain, with the draft model, lookup), so a host whose speed shifted since the
  probe, or a loop slower than the parts measured alone, changes what pays;
* exploration: a probe (one draft) after the policy's ``probe_every`` plain steps in a row.  Keeping the draft's
  confidence live during plain steps would cost one draft forward per step (1-3 ms against a 50 ms target step
  on the default pair, 2-6%): more than a periodic probe whose worst case is held under 2% of the plain time.

Every choice is a function of the past and of laws known before the token it gates is drawn, so the output law is
the target's (``toy_adaptive`` enumerates it exactly; ``tests/test_adaptive.py`` samples the real engine).
``decisions`` holds one line per step saying what was chosen and why; :meth:`AdaptiveDrafter.summary` sums them up.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

from ..sampling import SamplingConfig
from .adaptive_policy import SpeculationPolicy, StepCosts
from .base import Drafter

__all__ = ["AdaptiveDrafter", "StepTimes", "measure_step_costs"]


class StepTimes:
    """How the run's steps cost against the cost model: per kind of step (``plain``, ``model``: the draft model ran,
    ``lookup``: free proposals) the measured seconds over the predicted ones, as a ratio of sums discounted by
    ``decay`` at each step of the same kind, starting from ``prior[kind]`` (1: the model is right) with weight
    ``prior_steps``.  The policy multiplies its predicted seconds by these factors, so a cost model that is wrong
    for this run (a host whose speed shifted since the probe, a draft or a catch-up slower in the loop than alone)
    is corrected from the run's own wall-clock times, while acceptance is learned from the text: the two are
    never mixed (a check of tokens per second would compare the draft's steps on one stretch of text with plain
    steps on another).  Every factor depends on past steps only, so the output law stays the target's."""

    KINDS = ("plain", "model", "lookup")

    def __init__(self, prior: dict[str, float] | None = None, decay: float = 0.9, prior_steps: float = 2.0) -> None:
        self.decay = decay
        start = {kind: 1.0 for kind in self.KINDS} | dict(prior or {})
        self.sums = {kind: [prior_steps * start[kind], prior_steps] for kind in self.KINDS}  # measured, predicted

    def add(self, kind: str, measured: float, predicted: float) -> None:
        """One step of ``kind``: ``measured`` seconds (start to start) against ``predicted`` by the cost model."""
        if predicted <= 0 or measured <= 0:
            return
        g = self.sums[kind]
        r = min(max(measured / predicted, 1 / 3), 3.0)  # a step descheduled for a second must not rule the run
        g[:] = [g[0] * self.decay + r, g[1] * self.decay + 1.0]

    def factor(self, kind: str) -> float:
        m, p = self.sums[kind]
        return m / p

    def factors(self) -> dict[str, float]:
        return {kind: self.factor(kind) for kind in self.KINDS}


class AdaptiveDrafter(Drafter):
    """``inner`` (any Drafter; a ``HybridDrafter`` is unpacked into its model and lookup) with K chosen per step in
    0..``k_max`` (lookup steps up to the hybrid's ``lookup_k``) by a :class:`SpeculationPolicy` on ``costs``.  The
    engine's ``k`` is ignored: ``k_max`` rules.  ``measure``: correct the costs by the run's step times
    (:class:`StepTimes`; False: the cost model alone, e.g. costs in made-up units).  ``policy_kw`` go to the policy
    (prior, decay, probe_every, ...).
    The learned acceptance persists across generations of the same drafter."""

    def __init__(self, inner: Drafter, costs: StepCosts, k_max: int, *, measure: bool = True, **policy_kw) -> None:
        from .hybrid import HybridDrafter

        if not isinstance(inner, Drafter):
            raise ValueError(f"inner must be a Drafter (e.g. HybridDrafter(load_default_draft(target))), got "
                             f"{type(inner).__name__}; wrap a causal LM as ModelDrafter(model)")
        hybrid = isinstance(inner, HybridDrafter)
        self.inner, self.model = inner, inner.model if hybrid else inner
        self.lookup = inner.lookup if hybrid else None
        self.min_tokens, self.lookup_k = (inner.min_tokens, inner.lookup_k) if hybrid else (1, None)
        self.defers = bool(getattr(self.model, "accepts_foreign_proposals", False)) and hasattr(self.model, "propose_foreign")
        self.stepwise = hasattr(type(self.model), "keep_drafting")
        self.decisions: list[str] = []
        self.policy = SpeculationPolicy(costs, k_max, defers=self.defers, log=self.decisions.append, **policy_kw)
        self.k_max = self.policy.k_max
        self.needs_target_hidden = self.model.needs_target_hidden
        self.target_hidden_layers = getattr(self.model, "target_hidden_layers", None)
        self.default_k = self.k_max
        self.kinds: Counter = Counter()  # steps per kind: plain, probe, draft, lookup
        self.catch_ups = 0  # forwards feeding the draft what it skipped
        # measured over predicted seconds per kind of step; a plain step starts from a whole plain step of the
        # engine's loop (timed start to start, as every step is) over the bare forward T(1) the model predicts
        self.measure = bool(measure)
        self.times = StepTimes({"plain": (costs.plain_step or costs.T(1)) / costs.T(1)})
        self.policy.scale = self.times.factors()
        self._open: tuple[str, float, float] | None = None  # the step in progress: (kind, start time, predicted s)

    @property
    def forwards(self) -> int:  # draft model forwards
        return self.model.forwards

    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        # a draft that can catch up (``defers``) reads the prompt when it first drafts: a run that never drafts
        # (text the draft does not know) never pays the draft's prefill
        self.deferred = (prompt_ids, prompt_mask, target_hidden)  # the forwards' outputs are fresh tensors, as buffered
        if not self.defers:
            self._begin_model()
        self.device = prompt_ids.device
        self.history = [[t for t, m in zip(row, mrow) if m] for row, mrow in zip(prompt_ids.tolist(), prompt_mask.tolist())]
        self.buffer: list[list[int]] = [[] for _ in self.history]  # tokens the draft has not been fed (plain steps)
        self.buffer_hidden: list[list[torch.Tensor]] = [[] for _ in self.history]  # their target features [n, H]
        self.policy.behind = False
        self._open = None

    def max_proposal(self, k: int) -> int:
        return max(self.k_max, self.lookup_k or 0)

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        return self.propose_within(k, k, sampling, generator)

    def _empty(self) -> torch.Tensor:
        return torch.zeros(len(self.history), 0, dtype=torch.long, device=self.device)  # [B, 0]

    @torch.inference_mode()
    def propose_within(self, k: int, limit: int, sampling: SamplingConfig, generator: torch.Generator | None):
        now = time.perf_counter()
        if self.measure and self._open is not None and self._open[2] > 0:  # the last step, start to start
            self.times.add(self._open[0], now - self._open[1], self._open[2])
            self.policy.scale = self.times.factors()
        self._open = ("lookup", now, 0.0)
        B, kcap = len(self.history), min(self.k_max, limit)
        found: list[list[int]] = [[] for _ in range(B)]
        if self.lookup is not None:
            n_look = min(max(self.k_max, self.lookup_k or self.k_max), limit)
            found = [self.lookup.continuation(h, n_look) for h in self.history]
        self.sources = ["lookup" if len(f) >= self.min_tokens and self.lookup is not None else "draft" for f in found]
        if all(s == "lookup" for s in self.sources):  # no draft forward: the policy picks how many to verify
            width = max(len(f) for f in found)
            K = self.policy.start(width, self.sources)
            self.kind = "lookup" if K else "plain"
            self.last = torch.tensor([(f + [f[-1]] * width)[:K] for f in found], dtype=torch.long,
                                     device=self.device).reshape(B, K)  # [B, K] deterministic: q is one-hot
            return self.last, None
        plan = self.policy.start(kcap, self.sources)
        if plan == 0:
            self.kind = "plain"
            if not self.defers:  # the draft keeps its state only by drafting: one token, never proposed
                self.model.propose(1, sampling, generator)
                self.kind = "shadow"
            self.last = self._empty()
            return self.last, None
        self.kind = "probe" if self.policy.cur.forced else "draft"
        self._catch_up()
        tokens, probs = self._draft(kcap if self.stepwise else plan, sampling, generator)  # [B, K], [B, K, V] or None
        K = tokens.shape[1]
        if any(s == "lookup" for s in self.sources) and K:  # rows whose history repeats take the lookup's tokens
            tokens, probs = tokens.clone(), None if probs is None else probs.clone()
            for b, f in enumerate(found):
                if self.sources[b] == "lookup":
                    tokens[b] = torch.tensor((f + [f[-1]] * K)[:K], dtype=torch.long, device=tokens.device)
                    if probs is not None:
                        probs[b].zero_()
                        probs[b, torch.arange(K, device=probs.device), tokens[b]] = 1
            if self.defers:
                self.model.propose_foreign(tokens)
        if K == 0:
            self.kind = "plain"  # the draft's confidence stopped it at depth 0: a plain step after all
        self.last = tokens
        return tokens, probs

    def _draft(self, kk: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """The model's proposal, cut by the policy before each token (the hook) or after (reading the laws q only)."""
        if self.stepwise:
            self.model.keep_drafting = lambda j, conf: self.policy.keep_going(j, None if conf is None else conf.tolist())
            try:
                return self.model.propose(kk, sampling, generator)
            finally:
                self.model.keep_drafting = None
        tokens, probs = self.model.propose(kk, sampling, generator)
        K, informative = 0, probs is not None and not sampling.greedy  # a greedy q is one-hot: its top says nothing
        while K < tokens.shape[1] and self.policy.keep_going(K, probs[:, K].amax(-1).tolist() if informative else None):
            K += 1
        if K < tokens.shape[1] and self.defers:  # the draft is told which tokens it proposed, as after a lookup
            self.model.propose_foreign(tokens[:, :K])
        return tokens[:, :K], None if probs is None else probs[:, :K]

    def _begin_model(self) -> None:
        """The draft reads the prompt (its prefill); the seconds it took are left out of the step being timed, which
        the cost model does not charge for them."""
        if self.deferred is None:
            return
        t0 = time.perf_counter()
        self.model.begin(*self.deferred)
        self.deferred = None
        if self._open is not None:
            kind, start, predicted = self._open
            self._open = (kind, start + time.perf_counter() - t0, predicted)

    def _catch_up(self) -> None:
        """Feed the draft the prompt if it has not read it yet, then the tokens (and target features) of the steps it
        skipped, in one forward."""
        self._begin_model()
        if not any(self.buffer):
            return
        m = [len(x) for x in self.buffer]  # >= 1 each: every step commits at least one token per row
        M = max(m)
        toks = torch.tensor([x + [x[-1]] * (M - len(x)) for x in self.buffer], dtype=torch.long, device=self.device)  # [B, M]
        hidden = None
        if self.buffer_hidden[0]:
            rows = [torch.cat(h, 0) for h in self.buffer_hidden]  # [m_b, H] each
            hidden = torch.stack([torch.nn.functional.pad(h, (0, 0, 0, M - h.shape[0])) for h in rows])  # [B, M, H]
        n = torch.tensor(m, device=self.device) - 1  # [B]
        self.model.propose_foreign(toks[:, :M - 1])
        self.model.commit(n, toks[torch.arange(len(m), device=self.device), n], hidden)
        self.buffer = [[] for _ in self.buffer]
        self.buffer_hidden = [[] for _ in self.buffer]
        self.catch_ups += 1

    @torch.inference_mode()
    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        n, nxt, last = num_accepted.tolist(), next_token.tolist(), self.last.tolist()
        K = self.last.shape[1]
        self.kinds[self.kind] += 1
        self.policy.finish(K, n)
        if self._open is not None:  # timed until the next proposal, against what the cost model predicted for it
            self._open = (self.policy.last_kind, self._open[1], self.policy.last_predicted)
        for b, row in enumerate(self.history):
            row.extend(last[b][:n[b]] + [nxt[b]])
        if self.kind in ("draft", "probe", "shadow") or (K == 0 and not self.defers):
            self.model.commit(num_accepted, next_token, target_hidden)
            return
        for b in range(len(self.buffer)):  # plain or lookup step: the draft catches up when it drafts again
            self.buffer[b].extend(last[b][:n[b]] + [nxt[b]])
            if target_hidden is not None:
                self.buffer_hidden[b].append(target_hidden[b, :n[b] + 1])  # [n_b + 1, H] at pending, d_1..d_n

    def summary(self) -> str:
        """What the policy chose so far: steps per K and per kind, the measured step-time factors, and the first
        reason given for K = 0 and K > 0."""
        ks = Counter(int(line[2:line.index(":")]) for line in self.decisions)
        head = ", ".join(f"K={k} x{c}" for k, c in sorted(ks.items()))
        kinds = ", ".join(f"{kind} {c}" for kind, c in self.kinds.most_common())
        plain = next((line for line in self.decisions if line.startswith("K=0:")), None)
        drafted = next((line for line in self.decisions if not line.startswith("K=0:")), None)
        measured = ", ".join(f"{kind} {f:.2f}x" for kind, f in self.times.factors().items())
        return (f"steps {head} ({kinds}); step times over the cost model's: {measured}"
                + "".join(f"\n  e.g. {x}" for x in (plain, drafted) if x))


class _NoDrafts(Drafter):
    """Proposes nothing: every step of the speculative loop is a plain step (what ``measure_step_costs`` times)."""

    def begin(self, prompt_ids, prompt_mask, target_hidden) -> None:
        self.empty = prompt_ids.new_zeros(prompt_ids.shape[0], 0)  # [B, 0]

    def propose(self, k, sampling, generator):
        return self.empty, None

    def commit(self, num_accepted, next_token, target_hidden) -> None:
        pass


def measure_step_costs(target, model: Drafter, ids: torch.Tensor, k_max: int, *, tokens: int = 16,
                       max_width: int | None = None, rounds: int = 2) -> StepCosts:
    """:class:`StepCosts` measured on this machine in a few seconds: T(n) for n = 1..``max_width`` (default
    k_max + 1; the load-time dispatch probe's, ``target.dispatch_profile``, when it covers them, else
    ``lean.path.engine_verify_curve``: the forward the engines run), the draft's a and b from ``tokens``-token
    runs of ``model`` (a Drafter, or a causal LM) at K = 1 and K = k_max on ``ids`` [1, L] (seconds drafting per
    step), the overhead from the same runs' other time per step over a plain run's, and catch_up = b (one draft
    forward, whatever its width).  Every run is repeated ``rounds`` times, interleaved, and each per-step time is
    the fastest round's (``profiling.probe_cost``: another process on the cores only ever adds time)."""
    from ..lean.path import engine_verify_curve
    from ..profiling import probe_cost
    from ..speculative import autoregressive_generate, speculative_generate

    widths = list(range(1, max(max_width or k_max + 1, 2) + 1))
    d = getattr(target, "dispatch_profile", None)
    best = {int(n): ms / 1e3 for n, ms in (d.get("best_ms") or {}).items()} if d else {}
    curve = best if all(n in best for n in widths) else engine_verify_curve(target, widths, context=128, repeats=3)
    ks = sorted({1, k_max})
    ar_other, plain_steps = [], []
    drafting: dict[int, list[float]] = {k: [] for k in ks}
    other: dict[int, list[float]] = {k: [] for k in ks}
    autoregressive_generate(target, ids, 4)  # warm-ups
    speculative_generate(target, _NoDrafts(), ids, 4, k=1)
    for k in ks:
        speculative_generate(target, model, ids, 4, k=k)
    for _ in range(max(int(rounds), 1)):
        _, ar = autoregressive_generate(target, ids, tokens)
        ar_other.append(ar.time_other / max(ar.row_steps, 1))
        _, st = speculative_generate(target, _NoDrafts(), ids, tokens, k=1)  # plain steps in the speculative loop
        plain_steps.append((st.time_draft + st.time_verify + st.time_other) / max(st.row_steps, 1))
        for k in ks:
            _, st = speculative_generate(target, model, ids, tokens, k=k)
            steps = max(st.row_steps, 1)
            drafting[k].append(st.time_draft / steps)
            other[k].append(st.time_other / steps)
    plain_step = probe_cost(plain_steps)
    per_step = {k: (probe_cost(drafting[k]), probe_cost(other[k])) for k in ks}
    a = max(per_step[1][0], 0.0)
    b = max((per_step[k_max][0] - a) / (k_max - 1), 0.0) if k_max > 1 else a
    overhead = max(0.0, min(o for _, o in per_step.values()) - probe_cost(ar_other))
    # as measured at each width, not forced non-decreasing: a form's curve can dip (plain weights: a slow GEMM for
    # 2-3 rows, a faster one from 4), and the engine pays what the width it runs costs; but never below T(1): a
    # wider forward reads the same weights, and a dip under T(1) is the probe's noise
    return StepCosts(tuple(max(curve[n], curve[1]) for n in widths), a, b, overhead=overhead, catch_up=b,
                     plain_step=max(plain_step, curve[1]))
