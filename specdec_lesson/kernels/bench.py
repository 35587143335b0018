"""Benchmark the Triton kernels against their torch references: ``python -m specdec_lesson.kernels.bench``.

On CUDA: times each kernel and its reference with ``triton.testing.do_bench`` (median), at sizes
that fill a large GPU, checks the kernel's output against the reference on the same inputs,
reports achieved GB/s (bytes the kernel must move / median time) against a measured
device-to-device copy bandwidth, and writes ``benchmarks/results/kernels_<gpu>.csv`` (GPU name,
date, torch / triton versions on every row).  Without CUDA it says so and exits 0.

Goals on a GPU: >= 70% of copy bandwidth and >= 2x over the unfused torch reference for
verification (B=64, K=8, V=128256).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

Timer = Callable[[Callable[[], object]], float]  # fn -> milliseconds

# sizes that fill a large GPU (H100/H200 class)
GPU_SIZES = {
    "verify": dict(B=64, K=8, V=128256, dtype=torch.float32),
    "attention": dict(B=8, H=32, Hkv=8, N=64, P=4096, D=128, dtype=torch.bfloat16),
    "compact": dict(B=64, H=8, P=4032, N=64, D=128, depth=8, dtype=torch.bfloat16),
}
# tiny sizes for the CPU smoke test under TRITON_INTERPRET=1
SMOKE_SIZES = {
    "verify": dict(B=2, K=3, V=1000, dtype=torch.float32),
    "attention": dict(B=1, H=2, Hkv=1, N=5, P=27, D=64, dtype=torch.float32),
    "compact": dict(B=2, H=2, P=20, N=8, D=64, depth=4, dtype=torch.float32),
}
# (block_v, num_warps, num_stages, splits) swept for the verification kernel; results never depend on them
VERIFY_CONFIGS = [(bv, nw, 3, sp) for bv in (2048, 4096, 8192) for nw in (4, 8, 16) for sp in (1, 2, 4)]
VERIFY_CONFIGS += [(4096, 8, 1, sp) for sp in (1, 2, 4)]  # without software pipelining, for comparison
# (block_m, block_n, num_warps) swept for tree attention
ATTENTION_CONFIGS = [(64, 64, 4), (64, 128, 8), (128, 64, 8), (128, 128, 8)]

FIELDS = [
    "gpu", "date", "torch", "triton", "kernel", "config", "shape", "dtype", "triton_ms", "torch_ms",
    "speedup", "bytes", "triton_gbps", "copy_gbps", "frac_of_copy", "correct", "max_abs_err",
]


def cuda_timer(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def wall_timer(fn: Callable[[], object], reps: int = 3) -> float:
    """Median wall-clock milliseconds (CPU / interpreter smoke runs only)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbps(device: str, timer: Timer, nbytes: int) -> float:
    """Device-to-device copy bandwidth (read + write bytes / time)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def _verify_inputs(B, K, V, dtype, device, gen):
    from specdec_lesson.verify import draw_verify_randoms

    t_logits = torch.randn(B, K + 1, V, device=device, generator=gen) * 3  # [B, K+1, V]
    d_logits = t_logits[:, :K] + torch.randn(B, K, V, device=device, generator=gen)  # [B, K, V] correlated draft
    target_probs = torch.softmax(t_logits, -1).to(dtype)  # [B, K+1, V]
    draft_probs = torch.softmax(d_logits, -1).to(dtype)  # [B, K, V]
    draft_tokens = torch.multinomial(draft_probs.float().reshape(B * K, V), 1, generator=gen).reshape(B, K)  # [B, K]
    uniforms, exponentials = draw_verify_randoms(B, K, V, device=device, dtype=dtype, generator=gen)
    return target_probs, draft_probs, draft_tokens, uniforms, exponentials


def bench_verify(device, timer, size, copy_gbps, configs) -> list[dict]:
    from specdec_lesson.kernels.verify_chain import verify_chain_triton
    from specdec_lesson.verify import verify_chain_from_randoms

    B, K, V, dtype = size["B"], size["K"], size["V"], size["dtype"]
    gen = torch.Generator(device=device).manual_seed(0)
    args = _verify_inputs(B, K, V, dtype, device, gen)
    ref_n, ref_tok = verify_chain_from_randoms(*args)
    item = args[0].element_size()
    # bytes the kernel must touch: per row the accept-test scalars, p_n, E, and q_n unless all K passed
    rows_with_q = int((ref_n < K).sum())
    nbytes = B * K * (3 * item + args[2].element_size()) + (2 * B + rows_with_q) * V * item + 2 * B * 8
    torch_ms = timer(lambda: verify_chain_from_randoms(*args))
    rows = []
    for block_v, num_warps, num_stages, splits in configs:
        kw = dict(block_v=block_v, num_warps=num_warps, num_stages=num_stages, splits=splits)
        try:
            n, tok = verify_chain_triton(*args, **kw)
            ok = torch.equal(n, ref_n) and torch.equal(tok, ref_tok)
            ms = timer(lambda kw=kw: verify_chain_triton(*args, **kw))
        except Exception as exc:  # e.g. a configuration that needs more shared memory than the chip has
            print(f"verify_chain {kw}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        rows.append(_row("verify_chain", ",".join(f"{name}={val}" for name, val in kw.items()), f"B={B},K={K},V={V}", dtype,
                         ms, torch_ms, nbytes, copy_gbps, ok, 0.0))
    return rows


def bench_attention(device, timer, size, copy_gbps, configs) -> list[dict]:
    from specdec_lesson.kernels.reference import build_tree_mask, tree_attention
    from specdec_lesson.kernels.tree_attention import tree_attention_triton

    B, H, Hkv, N, P, D, dtype = (size[k] for k in ("B", "H", "Hkv", "N", "P", "D", "dtype"))
    S = P + N
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(B, H, N, D, device=device, generator=gen).to(dtype)  # [B, H, N, D]
    k = torch.randn(B, Hkv, S, D, device=device, generator=gen).to(dtype)  # [B, Hkv, S, D]
    v = torch.randn(B, Hkv, S, D, device=device, generator=gen).to(dtype)  # [B, Hkv, S, D]
    parent = torch.randint(0, N, (N,), device=device, generator=gen)
    tree = torch.eye(N, dtype=torch.bool, device=device)  # [N, N] random tree: node i's parent < i
    for i in range(1, N):
        tree[i] |= tree[int(parent[i]) % i]
    prefix = torch.ones(B, P, dtype=torch.bool, device=device)  # [B, P]
    prefix[:, : P // 16] = torch.rand(B, P // 16, device=device, generator=gen) > 0.5  # some left padding
    mask = build_tree_mask(prefix, tree)  # [B, N, S]
    ref = tree_attention(q.float(), k.float(), v.float(), mask)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    item = q.element_size()
    nbytes = 2 * B * Hkv * S * D * item + 2 * B * H * N * D * item + B * N * S
    torch_ms = timer(lambda: tree_attention(q, k, v, mask))
    rows = []
    for block_m, block_n, num_warps in configs:
        kw = dict(block_m=block_m, block_n=block_n, num_warps=num_warps)
        try:
            err = float((tree_attention_triton(q, k, v, mask, **kw).float() - ref).abs().max())
            ms = timer(lambda kw=kw: tree_attention_triton(q, k, v, mask, **kw))
        except Exception as exc:
            print(f"tree_attention {kw}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        rows.append(_row("tree_attention", ",".join(f"{name}={val}" for name, val in kw.items()),
                         f"B={B},H={H},Hkv={Hkv},N={N},S={S},D={D}", dtype, ms, torch_ms, nbytes, copy_gbps, err <= tol, err))
    return rows


def bench_compact(device, timer, size, copy_gbps) -> list[dict]:
    from specdec_lesson.kernels.compaction import compact_kv_triton
    from specdec_lesson.kernels.reference import compact_kv

    B, H, P, N, D, depth, dtype = (size[k] for k in ("B", "H", "P", "N", "D", "depth", "dtype"))
    S = P + N
    gen = torch.Generator(device=device).manual_seed(2)
    keys = torch.randn(B, H, S, D, device=device, generator=gen).to(dtype)  # [B, H, S, D]
    values = torch.randn(B, H, S, D, device=device, generator=gen).to(dtype)  # [B, H, S, D]
    nodes = torch.rand(B, N, device=device, generator=gen).argsort(-1)[:, :depth].sort(-1).values  # [B, depth] increasing
    src_index = P + nodes  # [B, depth] slots of the accepted path
    dst_start = torch.full((B,), P, dtype=torch.int64, device=device)  # [B]
    n_valid = torch.randint(1, depth + 1, (B,), device=device, generator=gen)  # [B]
    k1, v1 = keys.clone(), values.clone()
    compact_kv(k1, v1, src_index, dst_start, n_valid)
    k2, v2 = keys.clone(), values.clone()
    compact_kv_triton(k2, v2, src_index, dst_start, n_valid)
    ok = torch.equal(k1, k2) and torch.equal(v1, v2)
    nbytes = 2 * 2 * int(n_valid.sum()) * H * D * keys.element_size() + B * (depth + 2) * 8
    torch_ms = timer(lambda: compact_kv(keys, values, src_index, dst_start, n_valid, validate=False))
    ms = timer(lambda: compact_kv_triton(keys, values, src_index, dst_start, n_valid, validate=False))
    return [_row("compact_kv", "default", f"B={B},H={H},S={S},D={D},path<={depth}", dtype,
                 ms, torch_ms, nbytes, copy_gbps, ok, 0.0)]


def _row(kernel, config, shape, dtype, ms, torch_ms, nbytes, copy_gbps, correct, err) -> dict:
    gbps = nbytes / (ms * 1e-3) / 1e9
    return dict(kernel=kernel, config=config, shape=shape, dtype=str(dtype).replace("torch.", ""),
                triton_ms=f"{ms:.5f}", torch_ms=f"{torch_ms:.5f}", speedup=f"{torch_ms / ms:.3f}", bytes=nbytes,
                triton_gbps=f"{gbps:.1f}", copy_gbps=f"{copy_gbps:.1f}", frac_of_copy=f"{gbps / copy_gbps:.3f}",
                correct=bool(correct), max_abs_err=f"{err:.3g}")


def run_bench(
    device: str, timer: Timer, sizes: dict, copy_bytes: int,
    verify_configs=VERIFY_CONFIGS, attention_configs=ATTENTION_CONFIGS,
) -> list[dict]:
    """Every measurement row (dicts with the CSV fields, without the machine columns)."""
    copy_gbps = copy_bandwidth_gbps(device, timer, copy_bytes)
    rows = bench_verify(device, timer, sizes["verify"], copy_gbps, verify_configs)
    rows += bench_attention(device, timer, sizes["attention"], copy_gbps, attention_configs)
    rows += bench_compact(device, timer, sizes["compact"], copy_gbps)
    return rows


def write_csv(rows: list[dict], out_dir: Path, gpu_name: str) -> Path:
    import triton

    meta = dict(gpu=gpu_name, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                torch=torch.__version__, triton=triton.__version__)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"kernels_{re.sub(r'[^a-z0-9]+', '_', gpu_name.lower()).strip('_')}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({**meta, **r})
    return path


def _print(rows: list[dict]) -> None:
    cols = ["kernel", "config", "dtype", "triton_ms", "torch_ms", "speedup", "triton_gbps", "frac_of_copy", "correct"]
    print("  ".join(cols))
    for r in rows:
        print("  ".join(str(r[c]) for c in cols))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("benchmarks", "results"), help="folder for kernels_<gpu>.csv")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, wall-clock timer (runs on CPU in the interpreter)")
    args = ap.parse_args(argv)
    if args.smoke:
        import specdec_lesson.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA)

        device = "cuda" if torch.cuda.is_available() else "cpu"
        rows = run_bench(device, wall_timer, SMOKE_SIZES, 1 << 24,
                         verify_configs=[(256, 4, 2, 2)], attention_configs=[(16, 32, 4)])
        _print(rows)
        return 0 if all(r["correct"] for r in rows) else 1
    if not torch.cuda.is_available():
        print("specdec_lesson.kernels.bench needs CUDA (a GPU): nothing measured. "
              "(Run `python -m specdec_lesson.kernels.bench --smoke` for a CPU interpreter check.)")
        return 0
    import specdec_lesson.kernels  # noqa: F401

    name = torch.cuda.get_device_name()
    rows = run_bench("cuda", cuda_timer, GPU_SIZES, 1 << 30)
    _print(rows)
    path = write_csv(rows, Path(args.out), name)
    print(f"wrote {path}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
