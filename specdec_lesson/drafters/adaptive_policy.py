"""The adaptive speculation policy's arithmetic: step costs, acceptance learned from the run, the choice of K.

Each step the policy picks how many drafts to propose, K = 0 (a plain step) included, to maximise the expected
emitted tokens per second (SmartSpec's goodput; Hugging Face's dynamic lookahead, DISCO and EAGLE-2's confidence
gating estimate the same quantity more coarsely):

    rate(K) = E[tokens | K] / cost(K),   E[tokens | K] = 1 + sum_{j=1..K} alpha_1 ... alpha_j,
    cost(0) = T(1),   cost(K) = a + b (K - 1) + T(K + 1) + overhead (+ catch_up after plain steps),

with alpha_j the acceptance at depth j given depths 1..j-1 accepted, estimated from the run (Beta-smoothed counts,
discounted per step so the estimate follows the text), T(n) the target's forward over n tokens and a + b (K - 1)
the draft's cost (:class:`StepCosts`).  K = 0 whenever no K beats plain decoding.  While drafting, before each
draft token j+1 is drawn, the draft's law at that position is known: its top probability (the draft's confidence)
refines alpha_{j+1} (acceptance per confidence bin, learned with the confidence itself as the prior mean), and
drafting stops as soon as no longer proposal beats the rate of stopping here (the marginal token's expected gain
per second below the rate already secured).

Exactness: every decision is a function of the past and of laws known before the token they gate is drawn, never
of a drawn token's value, so each emitted token still follows the target's law (``toy_adaptive`` proves it with
Fractions; a policy that peeks at the drawn token is biased, and the same enumerator finds it).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..validate import as_int, as_prob, as_real

__all__ = ["StepCosts", "AcceptanceStats", "SpeculationPolicy", "expected_tokens_of", "choose_k"]


@dataclass(frozen=True)
class StepCosts:
    """Seconds of one step's parts: ``verify[n - 1]`` = T(n) (n = 1.., extended linearly by its last two entries),
    the draft's first token ``draft_first`` (a) and each further one ``draft_next`` (b), ``overhead`` per drafting
    step beyond a plain step (the draft's commit, verification), and ``catch_up``: feeding the draft the tokens of
    the plain steps it skipped, paid when drafting resumes.  ``plain_step``: a whole plain step in the engine's loop
    (T(1) plus the loop's own work; 0: unmeasured, taken as T(1)): the measured factor of plain steps starts from
    ``plain_step / T(1)``."""

    verify: tuple[float, ...]
    draft_first: float
    draft_next: float
    overhead: float = 0.0
    catch_up: float = 0.0
    plain_step: float = 0.0

    def __post_init__(self) -> None:
        ts = tuple(as_real(t, f"verify[{i}] (T({i + 1}), seconds)", lo=0.0, lo_open=True) for i, t in enumerate(self.verify))
        if not ts:
            raise ValueError("StepCosts needs T(1) at least: verify=(T(1), T(2), ...) in seconds")
        object.__setattr__(self, "verify", ts)
        for name in ("draft_first", "draft_next", "overhead", "catch_up", "plain_step"):
            object.__setattr__(self, name, as_real(getattr(self, name), f"{name} (seconds)", lo=0.0))

    @classmethod
    def linear(cls, t1: float, ratio8: float, draft_first: float, draft_next: float, **kw) -> StepCosts:
        """T(n) = T(1) (1 + (ratio8 - 1)(n - 1) / 7): a straight verify curve through T(8) / T(1) = ``ratio8``."""
        t1, ratio8 = as_real(t1, "t1", lo=0.0, lo_open=True), as_real(ratio8, "ratio8 (T(8)/T(1))", lo=1.0)
        return cls(tuple(t1 * (1 + (ratio8 - 1) * (n - 1) / 7) for n in range(1, 9)), draft_first, draft_next, **kw)

    def T(self, n: int) -> float:
        """T(n): the target's forward over n tokens."""
        n = as_int(n, "n (tokens per target forward)", lo=1)
        if n <= len(self.verify):
            return self.verify[n - 1]
        slope = self.verify[-1] - self.verify[-2] if len(self.verify) > 1 else 0.0
        return self.verify[-1] + max(slope, 0.0) * (n - len(self.verify))

    def draft(self, k: int) -> float:
        """The draft's seconds for K tokens: 0 for K = 0, a + b (K - 1) otherwise."""
        return 0.0 if k == 0 else self.draft_first + self.draft_next * (k - 1)

    def step(self, k: int, *, resume: bool = False, free_draft: bool = False) -> float:
        """Seconds of a step proposing K drafts (``resume``: the draft catches up first; ``free_draft``: a lookup
        proposal, no draft forward)."""
        if k == 0:
            return self.T(1)
        drafting = 0.0 if free_draft else self.draft(k) + (self.catch_up if resume else 0.0)
        return drafting + self.T(k + 1) + self.overhead


def expected_tokens_of(alphas: Sequence[float]) -> float:
    """E[tokens | K = len(alphas)] = 1 + sum_j prod_{i <= j} alpha_i (acceptance at each depth given the earlier)."""
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def choose_k(costs: StepCosts, alpha: float | Sequence[float], k_max: int, *, resume: bool = False) -> tuple[int, float]:
    """``(K, predicted speedup over a plain step)``: the K in 0..k_max maximising E[tokens | K] / cost(K) for
    acceptance ``alpha`` at every depth (or ``alpha[j - 1]`` at depth j); what the policy plans from fixed estimates."""
    k_max = as_int(k_max, "k_max", lo=0)
    alphas = [as_prob(alpha, "alpha")] * k_max if isinstance(alpha, (int, float)) else [as_prob(a, "alpha") for a in alpha]
    if len(alphas) < k_max:
        raise ValueError(f"alpha needs one acceptance per depth 1..{k_max}, got {len(alphas)}")
    rate = {k: expected_tokens_of(alphas[:k]) / costs.step(k, resume=resume) for k in range(k_max + 1)}
    best = max(rate, key=lambda k: (rate[k], -k))
    return best, rate[best] * costs.T(1)


class AcceptanceStats:
    """Acceptance counts per depth and per confidence bin, discounted by ``decay`` per step, with a Beta prior.

    alpha(j) = (acc_j + w m_j) / (seen_j + w), prior weight w, prior mean m_1 = ``prior_mean`` and m_j = alpha(j-1)
    below the root; given the draft's confidence c (its law's top
    probability at that position), alpha(c) = (acc_bin + w_c c) / (seen_bin + w_c): the confidence is the prior."""

    EDGES = (0.2, 0.4, 0.6, 0.8, 0.9, 0.97)

    def __init__(self, depths: int, prior_mean: float = 0.5, prior_weight: float = 2.0, decay: float = 0.98,
                 confidence_weight: float = 4.0) -> None:
        self.depths = as_int(depths, "depths", lo=1)
        self.prior_mean, self.decay = as_prob(prior_mean, "prior_mean"), as_prob(decay, "decay")
        self.prior_weight = as_real(prior_weight, "prior_weight", lo=0.0, lo_open=True)
        self.confidence_weight = as_real(confidence_weight, "confidence_weight", lo=0.0, lo_open=True)
        self.acc, self.seen = [0.0] * self.depths, [0.0] * self.depths
        nb = len(self.EDGES) + 1
        self.bin_acc, self.bin_seen = [0.0] * nb, [0.0] * nb

    def copy(self) -> AcceptanceStats:
        new = object.__new__(type(self))
        new.__dict__ = {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}
        return new

    def alpha(self, depth: int) -> float:
        """Estimated acceptance at ``depth`` (1-based; depths past the tracked ones share the deepest).  Depth 1
        shrinks towards ``prior_mean``, each deeper depth towards the estimate of the depth above it: a depth
        rarely reached inherits what the run saw nearer the root, not the prior (a draft that is accepted 30% of
        the time at depth 1 is not assumed 50% at depth 4)."""
        mean = self.prior_mean
        for j in range(min(depth, self.depths)):
            mean = (self.acc[j] + self.prior_weight * mean) / (self.seen[j] + self.prior_weight)
        return mean

    def alpha_given(self, confidence: float) -> float:
        """Estimated acceptance of a draft whose law's top probability is ``confidence``."""
        b = bisect_right(self.EDGES, confidence)
        return (self.bin_acc[b] + self.confidence_weight * confidence) / (self.bin_seen[b] + self.confidence_weight)

    def step(self) -> None:
        """Forget a little (once per step that observed something)."""
        for lst in (self.acc, self.seen, self.bin_acc, self.bin_seen):
            lst[:] = [v * self.decay for v in lst]

    def expect(self, depth: int, alpha: float) -> None:
        """A depth the draft's confidence stopped short of: count its predicted acceptance ``alpha`` as half an
        observation there (so a draft that keeps stopping at depth 1 lowers alpha(1) and the plan turns plain)."""
        d = min(depth, self.depths) - 1
        self.acc[d] += 0.5 * alpha
        self.seen[d] += 0.5

    def observe(self, proposed: int, accepted: int, confidences: Sequence[float | None] = ()) -> None:
        """One row of one step: ``proposed`` drafts, the first ``accepted`` passed; depth j counts when reached
        (j <= accepted + 1); ``confidences[j - 1]``, when known, is depth j's confidence."""
        for j in range(1, min(proposed, accepted + 1) + 1):
            ok = float(accepted >= j)
            d = min(j, self.depths) - 1
            self.acc[d] += ok
            self.seen[d] += 1.0
            if j <= len(confidences) and confidences[j - 1] is not None:
                b = bisect_right(self.EDGES, confidences[j - 1])
                self.bin_acc[b] += ok
                self.bin_seen[b] += 1.0


@dataclass
class _Step:
    """One step in progress: the plan, the rows' chances of reaching each depth, and the confidences seen."""

    kcap: int
    plan: int
    sources: list[str]
    free_draft: bool
    resume: bool
    forced: bool
    reach: list[float]  # per row: P(all drafts so far accepted)
    mean: list[float]  # per row: expected tokens secured so far (1 + sum of reach)
    confidences: list[list[float | None]]
    note: str = ""
    stopped: list[tuple[int, str, int, float]] | None = None  # (row, source, depth, predicted alpha): confidence stops
    stopped_at: int | None = None  # the depth at which drafting stopped before the plan's end


class SpeculationPolicy:
    """Chooses each step's K from the run's history and :class:`StepCosts` (see the module docstring).

    ``start(kcap, sources)`` -> the planned K (0: a plain step, draft nothing); while drafting, ``keep_going(j,
    confidences)`` is asked before draft j+1 is drawn; ``finish(proposed, accepted)`` learns from the outcome and
    logs why (``log``: one line per step).  ``defers``: plain steps skip the draft (its catch-up is then paid when
    drafting resumes).  Exploration: after ``probe_every`` steps in a row without the draft model (plain steps, and
    lookup steps, which teach the draft's acceptance nothing) a probe drafts one token (default:
    as often as keeps the probe's worst-case loss, alpha = 0, under ``explore`` of the plain steps' time)."""

    def __init__(self, costs: StepCosts, k_max: int, *, prior_mean: float = 0.5, prior_weight: float = 2.0,
                 decay: float = 0.98, use_confidence: bool = True, defers: bool = True, probe_every: int | None = None,
                 explore: float = 0.02, log: Callable[[str], None] | None = None) -> None:
        if not isinstance(costs, StepCosts):
            raise ValueError(f"costs must be a StepCosts (StepCosts.linear(...) or drafters.adaptive.measure_step_costs), "
                             f"got {type(costs).__name__}")
        self.costs, self.k_max = costs, as_int(k_max, "k_max (the most drafts one step may propose)", lo=1)
        self.stats = {s: AcceptanceStats(k_max, prior_mean, prior_weight, decay) for s in ("draft", "lookup")}
        self.use_confidence, self.defers = bool(use_confidence), bool(defers)
        if probe_every is None:
            worst = costs.step(1, resume=defers) - costs.T(1)  # a probe's loss when its draft is always rejected
            probe_every = max(2, math.ceil(worst / (as_real(explore, "explore", lo=0.0, lo_open=True) * costs.T(1))))
        self.probe_every = as_int(probe_every, "probe_every", lo=1)
        self.plain_streak, self.behind = 0, False  # steps in a row without the draft; whether it skipped some
        self.log = log
        self.cur: _Step | None = None
        # measured over predicted seconds per kind of step ("plain", "model", "lookup"; drafters.adaptive.StepTimes):
        # every predicted step cost is multiplied by its kind's factor
        self.scale = {"plain": 1.0, "model": 1.0, "lookup": 1.0}
        self.last_predicted, self.last_kind = 0.0, "plain"  # the finished step: seconds predicted for it as run

    def copy(self) -> SpeculationPolicy:
        new = object.__new__(type(self))
        new.__dict__ = dict(self.__dict__)
        new.stats = {s: st.copy() for s, st in self.stats.items()}
        new.cur, new.log = None, None
        return new

    def _alpha(self, source: str, depth: int, confidence: float | None = None) -> float:
        st = self.stats[source]
        return st.alpha_given(confidence) if confidence is not None and self.use_confidence else st.alpha(depth)

    def _expect(self, j: int, k: int, alpha_next: Sequence[float]) -> float:
        """Mean expected tokens per row of ending this step at K = ``k`` >= j, from depth j (j drafts so far), with
        the rows' acceptance ``alpha_next`` at depth j+1 and the depth estimates beyond."""
        c = self.cur
        total = 0.0
        for b, src in enumerate(c.sources):
            e, reach = c.mean[b], c.reach[b]
            for d in range(j + 1, k + 1):
                reach *= alpha_next[b] if d == j + 1 else self._alpha(src, d)
                e += reach
            total += e
        return total / len(c.sources)

    def _seconds(self, j: int, k: int) -> float:
        """Seconds of a step ending at K = ``k``, decided at depth ``j`` (-1: at the plan, nothing drafted yet), as
        the cost model predicts them, times the run's measured factor for that kind of step (``scale``)."""
        kind, sec = self._predict(j, k)
        return sec * self.scale[kind]

    def _predict(self, j: int, k: int) -> tuple[str, float]:
        """``(kind, seconds)`` of a step ending at K = ``k`` decided at depth ``j``, from the cost model alone.
        Stopping at k = j >= 0 has already paid the draft's look at position j+1 (a + b j, and any catch-up)."""
        c, costs = self.cur, self.costs
        if c.free_draft:  # a lookup step (K = 0 there: a plain step after all)
            return ("lookup" if k else "plain"), costs.step(k, free_draft=True)
        if k == 0 and j < 0:
            if not self.defers:  # a draft that cannot skip a step drafts a token it never proposes
                return "model", costs.T(1) + costs.draft_first
            return "plain", costs.T(1)
        if k > j or j < 0:
            return "model", costs.step(k, resume=c.resume)
        drafted = (costs.catch_up if c.resume else 0.0) + costs.draft_first + costs.draft_next * j
        return "model", drafted + costs.T(j + 1) + (costs.overhead if j > 0 else 0.0)

    def start(self, kcap: int, sources: Sequence[str]) -> int:
        """Plan a step of at most ``kcap`` drafts for rows drafting from ``sources`` ("draft" or "lookup")."""
        kcap = as_int(kcap, "kcap", lo=0)
        sources = list(sources)
        free = all(s == "lookup" for s in sources)
        resume = self.behind and not free
        self.cur = _Step(kcap, 0, sources, free, resume, False, [1.0] * len(sources), [1.0] * len(sources),
                         [[] for _ in sources])
        rates = {}
        first = [self._alpha(s, 1) for s in sources]
        for k in range(kcap + 1):
            e, sec = self._expect(0, k, first), self._seconds(-1, k)
            rates[k] = (e / sec, e, sec)
        best = max(rates, key=lambda k: (rates[k][0], -k))
        forced = best == 0 and kcap > 0 and not free and self.plain_streak + 1 >= self.probe_every
        self.cur.plan, self.cur.forced = (1 if forced else best), forced
        shown = "lookup" if free else "draft"
        alphas = " ".join(f"{self._alpha(shown, d):.2f}" for d in range(1, min(kcap, 4) + 1))
        if forced:
            self.cur.note = f"probe after {self.plain_streak} plain steps (alpha_hat {alphas})"
        elif best == 0:
            alt = max(range(1, kcap + 1), key=lambda k: rates[k][0], default=None)
            self.cur.note = (f"alpha_hat {alphas} by depth; plain step {rates[0][2] * 1e3:.0f} ms beats "
                             + (f"K={alt} {rates[alt][2] * 1e3:.0f} ms for {rates[alt][1]:.2f} tokens" if alt else "nothing"))
        else:
            e, sec = rates[best][1:]
            self.cur.note = (f"{'lookup ' if free else ''}alpha_hat {alphas} by depth; planned K={best}: {e:.2f} tokens in "
                             f"{sec * 1e3:.0f} ms = {rates[best][0] / rates[0][0]:.2f}x a plain step")
        return self.cur.plan

    def keep_going(self, j: int, confidences: Sequence[float | None] | None = None) -> bool:
        """Whether to draw draft j+1 (0-based j drafts so far), given each row's confidence at that position
        (None: unknown); called before the token is drawn, so the choice never depends on its value."""
        c = self.cur
        if c is None or j >= c.kcap:
            return False
        confs = list(confidences) if confidences is not None else [None] * len(c.sources)
        nxt = [self._alpha(s, j + 1, None if s == "lookup" else x) for s, x in zip(c.sources, confs)]
        go = c.forced and j == 0
        if not go:
            stop_rate = self._expect(j, j, nxt) / self._seconds(j, j)
            go = any(self._expect(j, k, nxt) / self._seconds(j, k) > stop_rate for k in range(j + 1, c.kcap + 1))
        if go:
            for b, a in enumerate(nxt):
                c.reach[b] *= a
                c.mean[b] += c.reach[b]
                c.confidences[b].append(confs[b])
        else:
            c.stopped_at = j
        if not go and confidences is not None and any(x is not None for x in confs):
            rows = enumerate(zip(c.sources, confs, nxt))
            c.stopped = [(b, s, j + 1, a) for b, (s, x, a) in rows if x is not None and s == "draft"]
        if not go and confidences is not None:
            mean_conf = sum(x for x in confs if x is not None) / max(1, sum(x is not None for x in confs))
            c.note += f"; stopped at depth {j}: confidence {mean_conf:.2f} -> alpha {sum(nxt) / len(nxt):.2f}"
        return go

    def finish(self, proposed: int, accepted: Sequence[int], sources: Sequence[str] | None = None) -> str:
        """Learn from a step (``proposed`` drafts per row, ``accepted[b]`` passed); returns and logs its line."""
        c = self.cur
        srcs = list(sources) if sources is not None else (c.sources if c is not None else ["draft"] * len(accepted))
        # a stop counts where its depth was reached (every earlier draft accepted): the policy's memory never
        # depends on what was drafted past a rejection (toy_adaptive enumerates up to the rejection only)
        stops = (c.stopped or []) if c is not None else []
        stopped = [(s, d, a) for b, s, d, a in stops if int(accepted[b]) >= d - 1]
        if proposed > 0 or stopped:
            for s in set(srcs) | {s for s, _, _ in stopped}:
                self.stats[s].step()
        if proposed > 0:
            for b, (s, n) in enumerate(zip(srcs, accepted)):
                confs = c.confidences[b] if c is not None and b < len(c.confidences) else []
                self.stats[s].observe(proposed, int(n), confs)
        for s, depth, a in stopped:
            self.stats[s].expect(depth, a)
        free = c.free_draft if c is not None else False
        if c is not None:  # what the cost model predicted for the step as it ran (StepTimes compares the clock)
            if c.stopped_at is not None and not free:
                self.last_kind, self.last_predicted = self._predict(c.stopped_at, c.stopped_at)
            else:
                self.last_kind, self.last_predicted = self._predict(-1, proposed)
        # steps in a row without the draft model: a lookup step (no draft forward) teaches the draft's acceptance
        # nothing either, so it must not put the next probe off
        self.plain_streak = self.plain_streak + 1 if proposed == 0 or free else 0
        if self.defers and (proposed == 0 or free):
            self.behind = True
        elif proposed > 0:
            self.behind = False
        line = f"K={proposed}: {c.note if c is not None else ''}"
        self.cur = None
        if self.log is not None:
            self.log(line)
        return line
