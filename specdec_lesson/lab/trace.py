"""A per-step record of a speculative run: what was drafted, what was accepted, what the target said.

Pass ``trace=Trace()`` to :func:`specdec_lesson.speculative.speculative_generate`; after the run,
``trace.steps`` holds one :class:`TraceStep` per (step, active row)::

    trace = Trace()
    out, stats = speculative_generate(target, drafter, ids, 64, k=4, trace=trace)
    trace.tokens(0) == out[0].tolist()           # the emitted tokens, step by step
    trace.summary()["alpha"] == stats.alpha       # the same counting as SpecStats

Each step of row b emits ``drafts[:n]`` (the accepted prefix, n = ``accepted``) and then ``next_token``:
the target's *correction* (drawn from the residual after the first rejection, n < K') or its *bonus*
token (drawn from p_K' when every draft passed).  EOS or the token budget may cut that list: ``emitted``
is what the row really got.  The drafts after the first rejection were never used (``rejected``).

The engine calls :meth:`Trace.start` once and :meth:`Trace.record` once per step, from the host lists
it already has (one transfer per step), so a trace adds no device work; with ``trace=None`` (the
default) the engine does not touch any of this.  :mod:`specdec_lesson.lab.render` draws a trace as
coloured text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["Trace", "TraceStep"]


@dataclass(frozen=True)
class TraceStep:
    """One row's part of one engine step (times are the step's, shared by the rows of the batch)."""

    step: int  # the engine's step number, 1-based
    row: int  # the row of the batch
    drafts: tuple[int, ...]  # the K' proposed tokens d_1..d_K' (K' = 0: nothing proposed, a plain step)
    accepted: int  # n: drafts accepted by verification (before any EOS / budget cut)
    next_token: int  # the target's token after them: correction (n < K') or bonus (n = K')
    emitted: tuple[int, ...]  # what the row emitted: (drafts[:n] + (next_token,)) cut at EOS / the budget
    draft_ms: float  # the step's drafting time
    verify_ms: float  # the step's target forward + verification (+ its one host transfer)

    def __post_init__(self) -> None:
        if not 0 <= self.accepted <= len(self.drafts):
            raise ValueError(f"step {self.step}, row {self.row}: accepted = {self.accepted} is outside 0..{len(self.drafts)} "
                             "(the number of drafts)")
        full = self.drafts[:self.accepted] + (self.next_token,)
        if self.emitted != full[:len(self.emitted)]:
            raise ValueError(f"step {self.step}, row {self.row}: emitted {list(self.emitted)} is not a prefix of the "
                             f"accepted drafts + next token {list(full)}")

    @property
    def k(self) -> int:
        """K': drafts proposed this step."""
        return len(self.drafts)

    @property
    def used(self) -> int:
        """Drafts emitted as accepted (as ``SpecStats``: a draft cut by EOS / the budget is not counted)."""
        return min(self.accepted, len(self.emitted))

    @property
    def rejected(self) -> tuple[int, ...]:
        """The first rejected draft and the never-checked drafts after it (empty when all passed)."""
        return self.drafts[self.accepted:]

    @property
    def kind(self) -> str:
        """``"correction"`` (a draft was rejected), ``"bonus"`` (all K' passed) or ``"plain"`` (K' = 0)."""
        return "plain" if not self.drafts else "bonus" if self.accepted == len(self.drafts) else "correction"

    @property
    def target_emitted(self) -> bool:
        """Whether the target's own token (correction / bonus) was emitted (not cut by EOS / the budget)."""
        return len(self.emitted) > self.accepted

    @property
    def rejection(self) -> bool:
        """An emitted rejection: the chain stopped at a draft and its correction was emitted (``SpecStats``)."""
        return self.accepted < len(self.drafts) and self.target_emitted


@dataclass
class Trace:
    """The steps of one run (see the module docstring).  ``prompts[b]``: row b's prompt (padding removed);
    ``k``: the run's drafts per step; ``batch``: its rows.  A Trace records one run: pass a new one each time."""

    steps: list[TraceStep] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    k: int = 0
    batch: int = 0

    # ------------------------------------------------------------------ the engine's two calls
    def start(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, k: int) -> None:
        """Called once by the engine before the first step (prompt_ids, prompt_mask: [B, L], left-padded)."""
        if self.batch:
            raise ValueError("this Trace already holds a run; pass a new Trace() to each speculative_generate call")
        self.prompts = [[t for t, m in zip(r, mr) if m] for r, mr in zip(prompt_ids.tolist(), prompt_mask.tolist())]
        self.k, self.batch = k, len(self.prompts)

    def record(self, step: int, host: list[list[int]], emitted: list[int], active: list[bool], draft_s: float,
               verify_s: float) -> None:
        """One engine step: ``host[b] = [n, next_token, d_1..d_K']`` (the engine's one host list), ``emitted[b]``
        tokens emitted by row b, ``active[b]`` whether row b was still generating; times in seconds."""
        for b, (row, e, a) in enumerate(zip(host, emitted, active)):
            if not a:
                continue
            n, nxt, drafts = row[0], row[1], tuple(row[2:])
            self.steps.append(TraceStep(step, b, drafts, n, nxt, (drafts[:n] + (nxt,))[:e], 1e3 * draft_s, 1e3 * verify_s))

    # ------------------------------------------------------------------ reading it
    def row(self, b: int = 0) -> list[TraceStep]:
        """Row ``b``'s steps, in order."""
        if not 0 <= b < max(self.batch, 1):
            raise ValueError(f"row must be in 0..{self.batch - 1}, got {b}")
        return [s for s in self.steps if s.row == b]

    def tokens(self, b: int = 0) -> list[int]:
        """Row ``b``'s emitted tokens: the engine's output for that row."""
        return [t for s in self.row(b) for t in s.emitted]

    def summary(self, b: int | None = None) -> dict:
        """Counts and rates over row ``b`` (None: every row), counted as :class:`~specdec_lesson.stats.SpecStats`:
        ``alpha`` = accepted / (accepted + rejections), ``utilisation`` = accepted / proposed, ``tau`` = emitted
        tokens per (row, step); ``draft_ms`` / ``verify_ms``: mean per step."""
        rows = self.steps if b is None else self.row(b)
        accepted = sum(s.used for s in rows)
        rejections = sum(s.rejection for s in rows)
        proposed = sum(s.k for s in rows)
        emitted = sum(len(s.emitted) for s in rows)
        per_step = {s.step: (s.draft_ms, s.verify_ms) for s in rows}  # one entry per engine step

        def ratio(x: float, y: float) -> float:
            return x / y if y else math.nan

        return {
            "steps": len(per_step), "row_steps": len(rows), "proposed": proposed, "accepted": accepted,
            "rejections": rejections, "emitted": emitted, "alpha": ratio(accepted, accepted + rejections),
            "utilisation": ratio(accepted, proposed), "tau": ratio(emitted, len(rows)),
            "bonus": sum(s.kind == "bonus" and s.target_emitted for s in rows),
            "draft_ms": ratio(sum(d for d, _ in per_step.values()), len(per_step)),
            "verify_ms": ratio(sum(v for _, v in per_step.values()), len(per_step)),
        }
