"""Latency model of speculative decoding: roofline cost of a forward pass, speedup of chains and trees,
the best K, and a seeded Monte Carlo run of a generation.  Pure functions, no widgets.

Roofline of one forward over ``n`` new tokens per row (``batch`` rows, ``context`` cached tokens),
split over ``n_devices`` GPUs with tensor parallelism::

    bytes  = matmul weights / tp + batch * (context + n) * KV bytes per token / tp
    FLOPs  = batch * n * (2 * matmul params + 4 * layers * heads * head_dim * (context + (n + 1) / 2)) / tp
    T      = max(bytes / bandwidth, FLOPs / peak) + all-reduce time + fixed per-step overhead
    all-reduce (tp > 1): 2 per layer, ring: 2 (tp - 1) / tp * message / link bandwidth + 2 (tp - 1) hop latencies,
                         message = batch * n * hidden * 2 bytes

Speedup of a chain (Leviathan et al., with the measured-style verify curve T(n) instead of "1")::

    S(K) = E[tokens](alpha, K) * T(1) / (K * t_draft + T(K + 1))

where both times include their per-step overhead, so ``c = t_draft / T(1)`` and ``verify_ratio(n) = T(n) / T(1)``
are exactly the arguments of :func:`specdec_lesson.theory.speedup`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..theory import best_k, expected_tokens, speedup
from ..validate import as_int, as_prob, as_real
from .presets import Hardware, ModelSpec, get_hardware, get_model

__all__ = [
    "ForwardCost", "forward_cost", "arithmetic_intensity", "SpecTiming", "spec_timing", "speedup_curve", "verify_ratio",
    "tree_expected_tokens", "tree_speedup", "SimRun", "simulate_generation", "best_k", "expected_tokens", "speedup",
]


@dataclass(frozen=True)
class ForwardCost:
    """Roofline cost of one forward pass (seconds, bytes, FLOPs per device)."""

    memory_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    bytes: float
    flops: float

    @property
    def total(self) -> float:
        return max(self.memory_s, self.compute_s) + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def _whole(value, name: str, lo: int) -> int:
    """A count: an integer (a float with an integer value, such as 1024.0 from arithmetic, is accepted)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return as_int(value, name, lo=lo)


def _kv_bytes(precision: str, kv_bytes: float | None) -> float:
    return kv_bytes if kv_bytes is not None else (4.0 if precision == "fp32" else 2.0)


def forward_cost(hardware: str | Hardware, model: str | ModelSpec, precision: str = "bf16", n_tokens: int = 1,
                 batch: int = 1, context: int = 1024, n_devices: int = 1, kv_bytes: float | None = None) -> ForwardCost:
    """Roofline time of one forward over ``n_tokens`` new tokens per row (a decode step is n = 1,
    verifying K drafts is n = K + 1).  See the module docstring for the formulas."""
    hw, m = get_hardware(hardware), get_model(model)
    n_tokens, batch, context, n_devices = (_whole(v, name, lo) for name, v, lo in (
        ("n_tokens", n_tokens, 1), ("batch", batch, 1), ("context", context, 0), ("n_devices", n_devices, 1)))
    if kv_bytes is not None:
        kv_bytes = as_real(kv_bytes, "kv_bytes", lo=0.0, lo_open=True)
    if n_devices > hw.max_devices or (n_devices > 1 and hw.link_bandwidth <= 0):
        most = hw.max_devices if hw.link_bandwidth > 0 else 1
        raise ValueError(f"{hw.name} supports at most {most} device(s), got n_devices={n_devices}")
    tp = n_devices
    kvb = _kv_bytes(precision, kv_bytes)
    nbytes = (m.streamed_bytes(precision) + batch * (context + n_tokens) * m.kv_bytes_per_token(kvb)) / tp
    attended = context + (n_tokens + 1) / 2
    flops = batch * n_tokens * (2 * m.matmul_params + 4 * m.n_layers * m.n_heads * m.head_dim * attended) / tp
    comm = 0.0
    if tp > 1:
        message = batch * n_tokens * m.hidden * 2.0
        one = 2 * (tp - 1) / tp * message / hw.link_bandwidth + 2 * (tp - 1) * hw.link_latency
        comm = 2 * m.n_layers * one
    return ForwardCost(nbytes / hw.bandwidth, flops / hw.flops, comm, hw.step_overhead, nbytes, flops)


def arithmetic_intensity(model: str | ModelSpec, precision: str = "fp16", batch: int = 1, context: int = 0,
                         n_tokens: int = 1) -> float:
    """FLOPs per byte read by one forward pass.

    Weights alone: 2 FLOPs per matmul parameter per token over ``bytes per parameter`` bytes, so at
    batch 1 in fp16 exactly 2 / 2 = 1 FLOP/byte (2 at int8, 4 at int4, times the batch).  The seed's
    "under 1 FLOP/byte" holds only if the whole 141 GB of Llama-3-70B, embedding table included, were
    streamed (139 GFLOP / 141 GB = 0.99); with a long context, GQA attention (8 query heads per KV
    head) adds 8 FLOPs per KV-cache byte and lifts the ratio a little above 1.  Either way it is
    about 1 FLOP/byte, hundreds of times below a GPU's ridge point (H100: ~295 FLOP/byte)."""
    c = forward_cost(_UNIT, model, precision, n_tokens=n_tokens, batch=batch, context=context)
    return c.flops / c.bytes


_UNIT = Hardware("unit", 1.0, 1.0, 1.0, step_overhead=0.0, max_devices=1)


@dataclass(frozen=True)
class SpecTiming:
    """One speculative step against plain decoding, all in seconds (per step, all rows together)."""

    k: int
    alpha: float
    batch: int
    t_target: float  # one plain decode step T(1), overhead included
    t_draft: float  # one draft forward, overhead included
    t_verify: float  # T(K+1), overhead included
    overhead: float  # the fixed per-step overheads inside K * t_draft + t_verify
    tokens_per_step: float  # E[tokens] per row

    @property
    def c(self) -> float:
        return self.t_draft / self.t_target

    @property
    def step_time(self) -> float:
        return self.k * self.t_draft + self.t_verify

    @property
    def speedup(self) -> float:
        return speedup(self.alpha, self.k, self.c, self.t_verify / self.t_target)

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.tokens_per_step / self.step_time

    @property
    def baseline_tokens_per_s(self) -> float:
        return self.batch / self.t_target

    def breakdown(self) -> dict[str, float]:
        """Seconds per step split into draft / verify / overhead (overheads pulled out of both)."""
        hw_draft = self.k * self.t_draft - self.draft_overhead
        return {"draft": hw_draft, "verify": self.step_time - self.overhead - hw_draft, "overhead": self.overhead}

    draft_overhead: float = 0.0


def spec_timing(hardware: str | Hardware, target: str | ModelSpec, draft: str | ModelSpec, k: int = 4,
                alpha: float = 0.8, precision: str = "bf16", batch: int = 1, context: int = 1024, n_devices: int = 1,
                draft_devices: int | None = None, draft_precision: str | None = None) -> SpecTiming:
    """Roofline times of a chain step with ``k`` drafts.  The draft runs on ``draft_devices`` GPUs
    (default: as many as the target, vLLM's default)."""
    k, alpha = as_int(k, "k", lo=1), as_prob(alpha, "alpha")
    dp = draft_precision or precision
    draft_devices = n_devices if draft_devices is None else draft_devices
    t1 = forward_cost(hardware, target, precision, 1, batch, context, n_devices)
    tv = forward_cost(hardware, target, precision, k + 1, batch, context, n_devices)
    td = forward_cost(hardware, draft, dp, 1, batch, context, draft_devices)
    overhead = k * td.overhead_s + tv.overhead_s
    return SpecTiming(k, alpha, batch, t1.total, td.total, tv.total, overhead, expected_tokens(alpha, k),
                      draft_overhead=k * td.overhead_s)


def speedup_curve(hardware: str | Hardware, target: str | ModelSpec, draft: str | ModelSpec, alpha: float = 0.8,
                  k_max: int = 16, **kw) -> tuple[list[float], int]:
    """S(K) for K = 1..k_max and the best K (via :func:`specdec_lesson.theory.best_k` with the roofline
    verify curve)."""
    alpha, k_max = as_prob(alpha, "alpha"), as_int(k_max, "k_max", lo=1)
    timings = [spec_timing(hardware, target, draft, k, alpha, **kw) for k in range(1, k_max + 1)]
    shared = {name: kw[name] for name in ("precision", "batch", "context", "n_devices") if name in kw}
    ratio = verify_ratio(hardware, target, **shared)
    kbest = best_k(alpha, timings[0].c, k_max=k_max, verify_ratio=ratio)
    return [t.speedup for t in timings], kbest


def verify_ratio(hardware: str | Hardware, target: str | ModelSpec, precision: str = "bf16", batch: int = 1,
                 context: int = 1024, n_devices: int = 1) -> Callable[[int], float]:
    """The roofline verify curve as a function: ``n -> T(n) / T(1)``, one target forward over n new tokens
    per row against one plain decode step (per-step overheads included in both)."""
    t1 = forward_cost(hardware, target, precision, 1, batch, context, n_devices).total

    def ratio(n: int) -> float:
        return forward_cost(hardware, target, precision, n, batch, context, n_devices).total / t1

    return ratio


# ----------------------------------------------------------------------------------------------- trees
def _check_depth_probs(accept_by_depth: Sequence[float], name: str = "accept_by_depth") -> list[float]:
    if isinstance(accept_by_depth, (str, bytes)) or not hasattr(accept_by_depth, "__iter__"):
        raise ValueError(f"{name} must be a non-empty sequence of probabilities in [0, 1], got {accept_by_depth!r}")
    a = [as_prob(x, f"{name}[{i}]") for i, x in enumerate(accept_by_depth)]
    if not a:
        raise ValueError(f"{name} must be a non-empty sequence of probabilities in [0, 1], got {accept_by_depth!r}")
    return a


def tree_expected_tokens(accept_by_depth: Sequence[float]) -> float:
    """E[tokens per verify] = 1 + sum_d prod_{j<=d} a_j, where a_d = P(the accepted path reaches depth d |
    it reached depth d-1) (for a tree, the chance that SOME child at that depth is accepted).  A chain
    is a_d = alpha for d = 1..K, giving (1 - alpha^(K+1)) / (1 - alpha)."""
    total, reach = 1.0, 1.0
    for a in _check_depth_probs(accept_by_depth):
        reach *= a
        total += reach
    return total


def tree_speedup(accept_by_depth: Sequence[float], n_nodes: int, c: float,
                 verify_ratio: float | Callable[[int], float] = 1.0, draft_passes: int | None = None) -> float:
    """S = E[tokens] / (draft_passes * c + T(n_nodes + 1) / T(1)); by default one draft pass per depth
    level (a level's siblings go through the draft together)."""
    depth = len(_check_depth_probs(accept_by_depth))
    n_nodes, c = as_int(n_nodes, "n_nodes", lo=1), as_real(c, "c", lo=0.0)
    if n_nodes < depth:
        raise ValueError(f"a tree of depth {depth} has at least {depth} nodes, got n_nodes={n_nodes}")
    passes = depth if draft_passes is None else as_int(draft_passes, "draft_passes", lo=0)
    name = f"verify_ratio({n_nodes + 1})" if callable(verify_ratio) else "verify_ratio"
    r = as_real(verify_ratio(n_nodes + 1) if callable(verify_ratio) else verify_ratio, name, lo=0.0, lo_open=True)
    return tree_expected_tokens(accept_by_depth) / (passes * c + r)


# ----------------------------------------------------------------------------------------- Monte Carlo
@dataclass
class SimRun:
    """A simulated generation: ``accepted[i]`` drafts accepted at step i (emitted = accepted + 1)."""

    k: int
    accepted: list[int]
    t_draft: float  # seconds per draft forward
    t_verify: float  # seconds per verify pass
    t_overhead: float = 0.0  # extra seconds per step
    t_baseline: float | None = None  # seconds per token of plain decoding, for speedup

    @property
    def step_time(self) -> float:
        return self.k * self.t_draft + self.t_verify + self.t_overhead

    @property
    def tokens(self) -> int:
        return sum(self.accepted) + len(self.accepted)

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / len(self.accepted)

    @property
    def time(self) -> float:
        return self.step_time * len(self.accepted)

    @property
    def speedup(self) -> float:
        if self.t_baseline is None:
            raise ValueError("speedup needs t_baseline (seconds per plain decode step)")
        return self.tokens * self.t_baseline / self.time

    def events(self, limit: int | None = None) -> list[dict]:
        """Per-step events for a timeline: start, draft / verify / overhead durations, accepted, emitted."""
        out, t = [], 0.0
        for i, n in enumerate(self.accepted[:limit]):
            out.append({"step": i, "start": t, "draft": self.k * self.t_draft, "verify": self.t_verify,
                        "overhead": self.t_overhead, "accepted": n, "emitted": n + 1})
            t += self.step_time
        return out


def simulate_generation(alpha: float | Sequence[float], k: int, n_steps: int, t_draft: float = 0.0, t_verify: float = 1.0,
                        t_overhead: float = 0.0, *, generator: torch.Generator | None = None, seed: int | None = 0,
                        t_baseline: float | None = None) -> SimRun:
    """Seeded Monte Carlo of ``n_steps`` chain steps: draft i is accepted with probability alpha (or
    ``alpha[i]`` per depth, conditional on its prefix), independently (Leviathan et al.'s i.i.d. model);
    a step emits the accepted prefix plus one token.  Pass ``generator`` or ``seed`` (never both)."""
    k, n_steps = as_int(k, "k", lo=1), as_int(n_steps, "n_steps", lo=1)
    many = hasattr(alpha, "__len__") and not isinstance(alpha, (str, bytes)) and getattr(alpha, "ndim", 1) != 0
    a = _check_depth_probs(alpha, "alpha") if many else [as_prob(alpha, "alpha")] * k
    if len(a) != k:
        raise ValueError(f"alpha must be a probability or a sequence of {k} probabilities, got {alpha!r}")
    t_draft, t_overhead = as_real(t_draft, "t_draft", lo=0.0), as_real(t_overhead, "t_overhead", lo=0.0)
    t_verify = as_real(t_verify, "t_verify", lo=0.0, lo_open=True)
    if t_baseline is not None:
        t_baseline = as_real(t_baseline, "t_baseline", lo=0.0, lo_open=True)
    if generator is not None and seed not in (None, 0):
        raise ValueError("pass either generator or seed, not both")
    if seed is not None:
        seed = as_int(seed, "seed", lo=0)
    gen = generator if generator is not None else torch.Generator().manual_seed(int(seed or 0))
    u = torch.rand(n_steps, k, generator=gen, dtype=torch.float64)  # [S, K]
    ok = u < torch.tensor(a, dtype=torch.float64)  # [S, K]
    accepted = ok.long().cumprod(dim=1).sum(dim=1)  # [S] leading run of accepted drafts
    return SimRun(k, accepted.tolist(), t_draft, t_verify, t_overhead, t_baseline)
