"""Does ``torch.compile`` pay for the lean forward on this CPU?  Measured, so the lean forward's default is a number.

The lean forward (``specdec_lesson.lean``) runs eagerly: per layer about a dozen small ops around four matrix
products.  Inductor (``torch.compile`` on CPU) can fuse the small ops (RMSNorm, RoPE, SiLU x up, the residual adds)
into generated C++; in the block variants the matrix products stay the library's (inductor's own C++ GEMM template
needs the weights frozen into the graph: the fourth variant).  This script times ONE forward over n new tokens
(batch 1, after a 128-token cache; n = 1 is a decode step, n = K + 1 a verify) four ways, interleaved over
``--rounds`` rounds (median):

* ``lean``: the engine's own forward (``lean.model.LeanLlama``), as tuned at load (plain / pre-packed per width);
* ``blocks-eager``: the same layer arithmetic written as two functions per layer (norm + QKV + RoPE; out projection +
  residual + norm + gate/up + SiLU + down + residual) with plain weights, run eagerly;
* ``blocks-compiled``: those two functions under ``torch.compile`` (inductor, static shapes: one compile per width).

The attention and the static cache stay eager in both block variants, so the difference is what compiling the
dense part buys.  A fourth variant compiles the whole forward:

* ``frozen-autotuned``: :class:`FrozenForward` (the same arithmetic as one module whose weights are parameters, the
  static cache's tensors passed in and written at a tensor of positions, attention over the cache's whole capacity
  with a mask) under ``torch.compile`` with inductor's ``freezing`` (weights folded into the graph as constants),
  ``max_autotune`` over its own C++ GEMM template and the library's (``CPP,ATEN``) and ``cpp_wrapper`` (no Python
  between the kernels).  The pre-packed oneDNN weights of the lean forward cannot be traced (opaque tensors), so
  the GEMM template is inductor's way to pack them; ``--no-frozen`` leaves it out (its compile takes minutes).

It records the compile time, each variant's logits against the lean forward's (max |difference|),
and the machine.  Needs a C++ compiler (inductor's); without one it says so and exits.

    python benchmarks/compile_probe.py              # about 15 minutes on a 2-core CPU (compiles included)
    python benchmarks/compile_probe.py --no-frozen  # about 2 minutes (the block variants only)
"""

from __future__ import annotations

import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec_lesson.bench.results import machine_info, write_results
from specdec_lesson.cli_args import OneLineParser, UsageError, check_output_file, max_threads

RESULTS = Path(__file__).resolve().parent / "results" / "compile_probe.json"
CONTEXT = 128


def block_functions(lean):
    """``pre(x, ln1, wqkv, cos, sin) -> q, k, v`` and ``post(x, att, wo, ln2, wgu, wdown) -> x``: one layer's dense
    arithmetic exactly as ``LeanLlama.forward`` does it for a batch of equal-length rows, plain weights."""
    nh, nkv, d, hidden, inter, eps = lean.heads, lean.kv_heads, lean.head_dim, lean.hidden, lean.inter, lean.eps
    g, half = nh // nkv, d // 2

    def pre(x, ln1, wqkv, cos, sin):
        b, n, _ = x.shape
        qkv = F.linear(F.rms_norm(x, (hidden,), ln1, eps), wqkv).view(b, n, nh + 2 * nkv, d)  # [B, n, nh + 2 nkv, D]
        qk = qkv[:, :, : nh + nkv]
        qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), dim=-1) * sin  # RoPE
        q = qk[:, :, :nh].reshape(b, n, nkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, nkv, g * n, d)  # [B, nkv, g n, D]
        return q, qk[:, :, nh:].transpose(1, 2), qkv[:, :, nh + nkv:].transpose(1, 2)  # k, v [B, nkv, n, D]

    def post(x, att, wo, ln2, wgu, wdown):
        b, n, _ = x.shape
        att = att.view(b, nkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(b, n, nh * d)  # [B, n, H]
        x = x + F.linear(att, wo)
        gu = F.linear(F.rms_norm(x, (hidden,), ln2, eps), wgu)  # [B, n, 2 I]
        return x + F.linear(F.silu(gu[..., :inter]) * gu[..., inter:], wdown)

    return pre, post


def block_forward(lean, pre, post, k_cache, v_cache, ids, start):
    """Logits [1, n, V] of ``ids [1, n]`` written at slots start.. of the given static cache (all n logits)."""
    n = ids.shape[1]
    g = lean.heads // lean.kv_heads
    keys = start + n
    x = F.embedding(ids, lean.embed)  # [1, n, H]
    cos, sin = lean.cos[start:keys, None], lean.sin[start:keys, None]  # [n, 1, D]
    mask = None
    if n > 1:  # causal over the new tokens, every cached key visible; query rows ordered (group, token)
        mask = (torch.arange(keys)[None, :] <= start + torch.arange(n)[:, None])[None, None]  # [1, 1, n, keys]
        mask = mask[:, :, None].expand(1, 1, g, n, keys).reshape(1, 1, g * n, keys)
    for i, lay in enumerate(lean.layers):
        q, k, v = pre(x, lay.ln1, lay.qkv.weight, cos, sin)
        k_cache[i, :, :, start:keys], v_cache[i, :, :, start:keys] = k, v
        att = F.scaled_dot_product_attention(q, k_cache[i, :, :, :keys], v_cache[i, :, :, :keys], attn_mask=mask)
        x = post(x, att, lay.o.weight, lay.ln2, lay.gate_up.weight, lay.down.weight)
    return F.linear(F.rms_norm(x, (lean.hidden,), lean.norm, lean.eps), lean.lm_head.weight)  # [1, n, V]


class FrozenForward(torch.nn.Module):
    """``LeanLlama.forward`` for batch 1 as one module with the weights as parameters (copies), for inductor's
    freezing: ``forward(ids [1, n], k_cache, v_cache [layers, 1, kv_heads, C, D], positions [n]) -> logits
    [1, n, V]``, keys and values written at ``positions`` (a tensor, so one graph per width serves every step),
    attention over all C slots, a key visible when its slot is at or before the query's position."""

    def __init__(self, lean) -> None:
        super().__init__()
        frozen = lambda t: torch.nn.Parameter(t.detach().clone(), requires_grad=False)  # noqa: E731
        layers = lean.layers
        self.wqkv = torch.nn.ParameterList([frozen(la.qkv.weight) for la in layers])
        self.wo = torch.nn.ParameterList([frozen(la.o.weight) for la in layers])
        self.wgu = torch.nn.ParameterList([frozen(la.gate_up.weight) for la in layers])
        self.wdown = torch.nn.ParameterList([frozen(la.down.weight) for la in layers])
        self.ln1 = torch.nn.ParameterList([frozen(la.ln1) for la in layers])
        self.ln2 = torch.nn.ParameterList([frozen(la.ln2) for la in layers])
        self.norm, self.embed, self.head = frozen(lean.norm), frozen(lean.embed), frozen(lean.lm_head.weight)
        self.register_buffer("cos", lean.cos.clone())  # [S, D]
        self.register_buffer("sin", lean.sin.clone())
        self.nh, self.nkv, self.d, self.hidden, self.inter, self.eps = (lean.heads, lean.kv_heads, lean.head_dim,
                                                                        lean.hidden, lean.inter, lean.eps)

    def forward(self, ids: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor):
        n, nh, nkv, d = ids.shape[1], self.nh, self.nkv, self.d
        g, half, slots = nh // nkv, d // 2, k_cache.shape[3]
        x = F.embedding(ids, self.embed)  # [1, n, H]
        cos, sin = self.cos.index_select(0, positions)[:, None], self.sin.index_select(0, positions)[:, None]  # [n, 1, D]
        mask = torch.arange(slots, device=ids.device)[None, :] <= positions[:, None]  # [n, C]
        mask = mask[None, None, None].expand(1, 1, g, n, slots).reshape(1, 1, g * n, slots)  # rows (group, token)
        for i in range(len(self.wqkv)):
            h = F.rms_norm(x, (self.hidden,), self.ln1[i], self.eps)
            qkv = F.linear(h, self.wqkv[i]).view(1, n, nh + 2 * nkv, d)  # [1, n, nh + 2 nkv, D]
            qk = qkv[:, :, : nh + nkv]
            qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), dim=-1) * sin  # RoPE
            k_cache[i].index_copy_(2, positions, qk[:, :, nh:].transpose(1, 2))  # [1, nkv, n, D] at the positions
            v_cache[i].index_copy_(2, positions, qkv[:, :, nh + nkv:].transpose(1, 2))
            q = qk[:, :, :nh].reshape(1, n, nkv, g, d).permute(0, 2, 3, 1, 4).reshape(1, nkv, g * n, d)
            att = F.scaled_dot_product_attention(q, k_cache[i], v_cache[i], attn_mask=mask)  # [1, nkv, g n, D]
            att = att.view(1, nkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(1, n, nh * d)  # [1, n, H]
            x = x + F.linear(att, self.wo[i])
            gu = F.linear(F.rms_norm(x, (self.hidden,), self.ln2[i], self.eps), self.wgu[i])  # [1, n, 2 I]
            x = x + F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter:], self.wdown[i])
        return F.linear(F.rms_norm(x, (self.hidden,), self.norm, self.eps), self.head)  # [1, n, V]


FROZEN_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN", "cpp_wrapper": True}


def main(argv: list[str] | None = None) -> int:
    try:
        a, ns, compiler = _args(argv)
    except UsageError as exc:
        print(f"compile_probe.py: error: {exc}", file=sys.stderr)
        return 2
    return run(a, ns, compiler)


def _args(argv):
    ap = OneLineParser(prog="compile_probe.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="1,2,3,4,5,8", help="forward widths n, comma-separated")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--force", action="store_true", help="replace an existing results file")
    ap.add_argument("--no-frozen", action="store_true", help="leave out the frozen, autotuned whole forward")
    a = ap.parse_args(argv)
    try:
        ns = sorted({int(x) for x in a.widths.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--widths must be comma-separated integers, got {a.widths!r}") from None
    if not ns or min(ns) < 1 or max(ns) > 64:
        raise UsageError(f"--widths must list widths in 1..64, got {a.widths!r}")
    if a.rounds < 1 or not 1 <= a.threads <= max_threads():
        raise UsageError(f"--rounds must be >= 1 and --threads in 1..{max_threads()}")
    if a.out.exists() and not a.force:
        raise UsageError(f"{a.out} exists: pass --force to replace it, or choose another --out")
    check_output_file(a.out, "--out")
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        raise UsageError("no C++ compiler on PATH (inductor needs one): install g++ (apt-get install g++) and run again")
    return a, ns, compiler


def run(a, ns: list[int], compiler: str) -> int:
    with tempfile.TemporaryDirectory(prefix="compile_probe_") as cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir  # a cold compile: nothing reused from an earlier run
        return _run(a, ns, compiler)


def _run(a, ns: list[int], compiler: str) -> int:
    torch.set_num_threads(a.threads)
    from specdec_lesson.drafters.pair import load_default_target
    from specdec_lesson.lean.model import lean_model, lean_verify_curve, tune_lean_dispatch

    target, _ = load_default_target("cpu", fast=True, verbose=False)
    tuned = tune_lean_dispatch(target, repeats=3)
    lean = lean_model(target)
    pre, post = block_functions(lean)
    pre_c, post_c = torch.compile(pre, dynamic=False), torch.compile(post, dynamic=False)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, lean.embed.shape[0], (1, CONTEXT), generator=gen)  # [1, 128]
    new = torch.randint(0, lean.embed.shape[0], (1, max(ns)), generator=gen)  # [1, n_max]
    with torch.inference_mode():
        cache = lean.new_cache(1, CONTEXT + max(ns))
        lean.forward(prompt, cache, cache.plan(CONTEXT))
        kc, vc = cache.k.clone(), cache.v.clone()  # [layers, 1, kv_heads, capacity, D]: the prompt's keys and values
        variants = {"blocks-eager": (pre, post), "blocks-compiled": (pre_c, post_c)}
        t0 = time.perf_counter()
        for n in ns:  # one compile per width (static shapes), timed
            block_forward(lean, pre_c, post_c, kc, vc, new[:, :n], CONTEXT)
        compile_s = time.perf_counter() - t0
        ref, _ = lean.forward(new, cache, cache.plan(max(ns)))  # [1, n_max, V]
        cache.set_lengths([CONTEXT])
        diffs = {}
        runs = {name: (lambda n, f=f, g=g: block_forward(lean, f, g, kc, vc, new[:, :n], CONTEXT))
                for name, (f, g) in variants.items()}
        compile_frozen_s = None
        if not a.no_frozen:
            frozen, fk, fv = FrozenForward(lean).eval(), kc.clone(), vc.clone()
            dynamo = torch._dynamo.config
            setattr(dynamo, "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit", 64)
            frozen_c = torch.compile(frozen, dynamic=False)
            at = lambda n: torch.arange(CONTEXT, CONTEXT + n)  # noqa: E731
            t0 = time.perf_counter()
            with torch._inductor.config.patch(FROZEN_OPTIONS):  # passed as torch.compile(options=), no GEMM was autotuned
                for n in ns:  # one compile per width
                    frozen_c(new[:, :n], fk, fv, at(n))
            compile_frozen_s = time.perf_counter() - t0
            runs["frozen-autotuned"] = lambda n: frozen_c(new[:, :n], fk, fv, at(n))
        for name, f in runs.items():
            diffs[name] = float((f(max(ns)) - ref).abs().max())
        times: dict[str, dict[int, list[float]]] = {v: {n: [] for n in ns} for v in ("lean", *runs)}
        for r in range(a.rounds + 1):  # round 0 warms up
            for n, ts in lean_verify_curve(lean, ns, CONTEXT, warmup=False).items():
                times["lean"][n] += [t * 1e3 for t in ts] if r else []
            for name, f in runs.items():
                for n in ns:
                    t = time.perf_counter()
                    f(n)
                    if r:
                        times[name][n].append((time.perf_counter() - t) * 1e3)
    med = {v: {n: round(statistics.median(ts), 2) for n, ts in d.items()} for v, d in times.items()}
    for v, d in med.items():
        print(f"{v:16s} " + "  ".join(f"T({n}) {ms:6.1f}" for n, ms in d.items()) + " ms")
    print(f"compile: {compile_s:.1f} s for {len(ns)} widths (blocks), "
          f"{compile_frozen_s if compile_frozen_s is None else round(compile_frozen_s, 1)} s (frozen-autotuned); "
          f"max |logit - lean| {diffs}")
    result = {
        "what": "one forward over n new tokens (batch 1, 128-token cache), ms, median of interleaved rounds: the lean "
                "forward as tuned, its layer arithmetic eager, the same under torch.compile (inductor), and the whole "
                "forward compiled with frozen weights and autotuned GEMMs",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine_info(),
        "compiler": compiler, "rounds": a.rounds, "lean_dispatch": tuned,
        "ms": med, "compile_s": round(compile_s, 1),
        "compile_frozen_s": None if compile_frozen_s is None else round(compile_frozen_s, 1),
        "frozen_options": None if a.no_frozen else FROZEN_OPTIONS,
        "compile_note": "wall time of the first compiled forward per width, with an empty inductor cache (cold); "
                        "frozen-autotuned: all its widths, autotuning included",
        "max_abs_logit_diff_vs_lean": diffs,
        "speedup_compiled_over_eager": {n: round(med["blocks-eager"][n] / med["blocks-compiled"][n], 3) for n in ns},
        "fastest_over_lean": {n: round(med["lean"][n] / min(med[v][n] for v in runs), 3) for n in ns},
    }
    write_results(result, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
