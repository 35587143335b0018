"""Does ``torch.compile`` pay for the lean forward on this CPU?  Measured, so the lean forward's default is a number.

The lean forward (``specdec_lesson.lean``) runs eagerly: per layer about a dozen small ops around four matrix
products.  Inductor (``torch.compile`` on CPU) can fuse the small ops (RMSNorm, RoPE, SiLU x up, the residual adds)
into generated C++; the matrix products stay the library's (inductor's own C++ GEMM template needs weights frozen
into the graph, not tried here).  This script times ONE forward over n new tokens (batch 1, after a 128-token
cache; n = 1 is a decode step, n = K + 1 a verify) three ways, interleaved over ``--rounds`` rounds (median):

* ``lean``: the engine's own forward (``lean.model.LeanLlama``), as tuned at load (plain / pre-packed per width);
* ``blocks-eager``: the same layer arithmetic written as two functions per layer (norm + QKV + RoPE; out projection +
  residual + norm + gate/up + SiLU + down + residual) with plain weights, run eagerly;
* ``blocks-compiled``: those two functions under ``torch.compile`` (inductor, static shapes: one compile per width).

The attention and the static cache stay eager in both block variants, so the difference is what compiling the
dense part buys.  It records the compile time, each variant's logits against the lean forward's (max |difference|),
and the machine.  Needs a C++ compiler (inductor's); without one it says so and exits.

    python benchmarks/compile_probe.py            # about 2 minutes on a 2-core CPU (compile included)
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
        for name, (f, g) in variants.items():
            diffs[name] = float((block_forward(lean, f, g, kc, vc, new, CONTEXT) - ref).abs().max())
        times: dict[str, dict[int, list[float]]] = {v: {n: [] for n in ns} for v in ("lean", *variants)}
        for r in range(a.rounds + 1):  # round 0 warms up
            for n, ts in lean_verify_curve(lean, ns, CONTEXT, warmup=False).items():
                times["lean"][n] += [t * 1e3 for t in ts] if r else []
            for name, (f, g) in variants.items():
                for n in ns:
                    t = time.perf_counter()
                    block_forward(lean, f, g, kc, vc, new[:, :n], CONTEXT)
                    if r:
                        times[name][n].append((time.perf_counter() - t) * 1e3)
    med = {v: {n: round(statistics.median(ts), 2) for n, ts in d.items()} for v, d in times.items()}
    for v, d in med.items():
        print(f"{v:16s} " + "  ".join(f"T({n}) {ms:6.1f}" for n, ms in d.items()) + " ms")
    print(f"compile: {compile_s:.1f} s for {len(ns)} widths; max |logit - lean| {diffs}")
    result = {
        "what": "one forward over n new tokens (batch 1, 128-token cache), ms, median of interleaved rounds: the lean "
                "forward as tuned, its layer arithmetic eager, and the same under torch.compile (inductor)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine_info(),
        "compiler": compiler, "rounds": a.rounds, "lean_dispatch": tuned,
        "ms": med, "compile_s": round(compile_s, 1),
        "compile_note": "wall time of the first compiled forward per width, with an empty inductor cache (cold)",
        "max_abs_logit_diff_vs_lean": diffs,
        "speedup_compiled_over_eager": {n: round(med["blocks-eager"][n] / med["blocks-compiled"][n], 3) for n in ns},
        "fastest_over_lean": {n: round(med["lean"][n] / min(med["blocks-compiled"][n], med["blocks-eager"][n]), 3)
                              for n in ns},
    }
    write_results(result, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
