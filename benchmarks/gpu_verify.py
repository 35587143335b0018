"""Two sections of the GPU suite about chain verification (``benchmarks/gpu_suite.py`` runs them).

``verify_grid``: notebook 05's bytes-moved model beside measured times, at B in {1, 16, 64},
V in {32,000, 128,256}, K = 8, laws in fp32 and bf16.  For each point: the torch reference
(``verify_chain_from_randoms``), the fused wrapper (``verify_chain_triton``, which for bf16 laws
first upcasts and renormalises in torch), the upcast alone (``prepare_verify_inputs``), and the
kernel alone on already-prepared fp32 laws at splits 1, 4 and 16.  Milliseconds are
``triton.testing.do_bench`` medians; GB/s divide the model's bytes
(:mod:`specdec_lesson.kernels.bytes_model`) by them; ``correct`` is bit equality of the wrapper's
output with the reference's on the same inputs.

``bitexact``: many random cases (B, K, V, law dtype, splits, sharpness drawn from a seeded
generator): the kernel's ``(num_accepted, next_token)`` against the torch reference on the GPU and
against the reference on the CPU, bit for bit, with the count of cases, of rows, and of
mismatches.  This is the GPU run of what ``tests/test_kernels.py`` checks in the interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

GRID = dict(Bs=(1, 16, 64), Vs=(32_000, 128_256), K=8, dtypes=(torch.float32, torch.bfloat16), splits=(1, 4, 16))
DRY_GRID = dict(Bs=(1, 2), Vs=(700,), K=3, dtypes=(torch.float32, torch.bfloat16), splits=(1, 2))
N_CASES, DRY_CASES = 200, 6


def section_verify_grid(device: str, dry: bool, timer: Callable, copy_gbps: float) -> dict:
    from specdec_lesson.kernels.bench import _verify_inputs
    from specdec_lesson.kernels.bytes_model import verify_bytes
    from specdec_lesson.kernels.verify_chain import verify_chain_triton
    from specdec_lesson.verify.chain import prepare_verify_inputs, verify_chain_from_randoms

    g = DRY_GRID if dry else GRID
    rows = []
    for B in g["Bs"]:
        for V in g["Vs"]:
            for dtype in g["dtypes"]:
                K = g["K"]
                gen = torch.Generator(device=device).manual_seed(B * 1000 + V)
                args = _verify_inputs(B, K, V, dtype, device, gen)
                ref_n, ref_tok = verify_chain_from_randoms(*args)
                n, tok = verify_chain_triton(*args)
                ok = bool(torch.equal(n, ref_n) and torch.equal(tok, ref_tok))
                half = dtype != torch.float32
                model = verify_bytes(B, K, V, half, rows_with_q=int((ref_n < K).sum()))
                ref_ms = timer(lambda a=args: verify_chain_from_randoms(*a))
                fused_ms = timer(lambda a=args: verify_chain_triton(*a))
                prepared = prepare_verify_inputs(args[0], args[1], args[3], args[4])
                prep_ms = timer(lambda a=args: prepare_verify_inputs(a[0], a[1], a[3], a[4])) if half else 0.0
                pargs = (prepared[0], prepared[1], args[2], prepared[2], prepared[3])
                kernel = {}
                for s in g["splits"]:
                    kn, kt = verify_chain_triton(*pargs, splits=s)
                    ok = ok and bool(torch.equal(kn, ref_n) and torch.equal(kt, ref_tok))
                    kernel[s] = timer(lambda p=pargs, s=s: verify_chain_triton(*p, splits=s))
                best_s = min(kernel, key=kernel.get)
                rows.append({
                    "name": "verify_grid", "shape": f"B={B},K={K},V={V}", "dtype": str(dtype).replace("torch.", ""),
                    "batch": B, "n": K, "ms": f"{fused_ms:.4f}", "torch_ms": f"{ref_ms:.4f}",
                    "speedup": f"{ref_ms / fused_ms:.2f}", "prepare_ms": f"{prep_ms:.4f}",
                    "kernel_ms_by_splits": {str(s): round(v, 4) for s, v in kernel.items()}, "best_splits": best_s,
                    "model_mb": {"prepare": model.prepare / 1e6, "reference": model.reference_total / 1e6,
                                 "fused": model.fused_total / 1e6, "fused_kernel": model.fused / 1e6},
                    "gbps": f"{model.fused / (kernel[best_s] * 1e-3) / 1e9:.1f}",
                    "reference_gbps": f"{model.reference_total / (ref_ms * 1e-3) / 1e9:.1f}",
                    "prepare_gbps": f"{model.prepare / (prep_ms * 1e-3) / 1e9:.1f}" if half else "",
                    "copy_gbps": f"{copy_gbps:.1f}",
                    "frac_of_copy": f"{model.fused / (kernel[best_s] * 1e-3) / 1e9 / copy_gbps:.3f}",
                    "correct": ok,
                })
    return {"rows": rows, "all_correct": all(r["correct"] for r in rows),
            "bytes_model": "specdec_lesson.kernels.bytes_model (reads + writes of full rows; caches ignored)"}


def _case(meta: torch.Generator) -> dict:
    def pick(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=meta))

    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    V = int(math.exp(float(torch.empty(1).uniform_(math.log(300), math.log(131_072), generator=meta))))
    return dict(B=pick(1, 64), K=pick(1, 8), V=V, dtype=dtypes[pick(0, 3)], splits=2 ** pick(0, 3),
                sharp=float(torch.empty(1).uniform_(0.5, 8.0, generator=meta)))


def section_bitexact(device: str, dry: bool) -> dict:
    from specdec_lesson.kernels.verify_chain import verify_chain_triton
    from specdec_lesson.verify.chain import draw_verify_randoms, verify_chain_from_randoms

    meta = torch.Generator().manual_seed(20261204)
    n_cases = DRY_CASES if dry else N_CASES
    rows_total = mism_dev = mism_cpu = 0
    lengths: dict[int, int] = {}
    failures = []
    for i in range(n_cases):
        c = _case(meta)
        if dry:
            c["V"], c["B"] = min(c["V"], 900), min(c["B"], 3)
        B, K, V = c["B"], c["K"], c["V"]
        gen = torch.Generator(device=device).manual_seed(i)
        t_logits = torch.randn(B, K + 1, V, device=device, generator=gen, dtype=torch.float64) * c["sharp"]  # [B, K+1, V]
        d_logits = t_logits[:, :K] + torch.randn(B, K, V, device=device, generator=gen, dtype=torch.float64) * 0.7
        target_probs = torch.softmax(t_logits, -1).to(c["dtype"])  # [B, K+1, V]
        draft_probs = torch.softmax(d_logits, -1).to(c["dtype"])  # [B, K, V]
        tokens = torch.multinomial(draft_probs.double().reshape(B * K, V), 1, generator=gen).reshape(B, K)  # [B, K]
        u, e = draw_verify_randoms(B, K, V, device=device, dtype=c["dtype"], generator=gen)
        args = (target_probs, draft_probs, tokens, u, e)
        n, tok = verify_chain_triton(*args, splits=c["splits"])
        rn, rt = verify_chain_from_randoms(*args)
        cn, ct = verify_chain_from_randoms(*(a.cpu() for a in args))
        bad_dev = int(((n != rn) | (tok != rt)).sum())
        bad_cpu = int(((n.cpu() != cn) | (tok.cpu() != ct)).sum())
        rows_total += B
        mism_dev += bad_dev
        mism_cpu += bad_cpu
        for a in n.tolist():
            lengths[a] = lengths.get(a, 0) + 1
        if bad_dev or bad_cpu:
            failures.append({**{k: str(v) for k, v in c.items()}, "case": i, "rows_vs_gpu_ref": bad_dev,
                             "rows_vs_cpu_ref": bad_cpu})
    summary = {"name": "verify_chain bit-exact", "shape": f"{n_cases} random cases, {rows_total} rows",
               "correct": mism_dev == 0 and mism_cpu == 0, "max_abs_err": f"{mism_dev + mism_cpu} mismatched rows"}
    return {"rows": [summary], "cases": n_cases, "rows_checked": rows_total, "mismatched_rows_vs_gpu_reference": mism_dev,
            "mismatched_rows_vs_cpu_reference": mism_cpu, "accepted_length_counts": dict(sorted(lengths.items())),
            "failures": failures[:20], "all_correct": mism_dev == 0 and mism_cpu == 0}
