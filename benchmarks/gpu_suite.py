"""The GPU suite: one command for one large GPU (H100/H200 class), well under 8 minutes.

    python benchmarks/gpu_suite.py            # on the GPU machine: benchmarks/results/gpu_suite_<gpu>_<date>.{json,csv}
    python benchmarks/gpu_suite.py --dry-run  # anywhere (CPU): tiny shapes, the same code paths, seconds

Sections, in the order they run (``bitexact`` and ``verify_grid`` live in ``benchmarks/gpu_verify.py``;
each one is timed and fenced: an exception is recorded in the JSON and the next section runs;
a section that would start past ``--budget-s`` is skipped, and says so):

0. ``bitexact`` (200 random cases of the fused verifier against the torch reference on the GPU and on the
   CPU, bit for bit) and ``verify_grid`` (the bytes-moved model of notebook 05 beside measured times at
   B in {1, 16, 64}, V in {32k, 128k}, fp32 and bf16 laws, the bf16 upcast timed on its own).
1. ``copy``: device-to-device copy bandwidth of a plain tensor copy (``dst.copy_(src)``, 1 GiB):
   every GB/s figure below is also given as a fraction of it.
2. ``kernels``: the Triton kernels of ``specdec_lesson/kernels`` (``verify_chain_triton``,
   ``tree_attention_triton``, ``compact_kv_triton``) against their torch references, at the sizes and
   with the configuration sweeps of ``python -m specdec_lesson.kernels.bench`` (its functions, reused):
   milliseconds (``triton.testing.do_bench`` medians), GB/s of the bytes each kernel must move,
   speedup over the reference, and a correctness check on the same inputs.
3. ``tree_attention``: the tree-attention kernel at realistic serving sizes (Llama-3-8B heads: 32 query
   heads, 8 KV heads, head dim 128, bf16; trees of 16..128 nodes over 1k..16k-token prefixes, batch 1..32).
4. ``verify_curve``: a random-weight Llama-3-8B-shaped model in bf16 built from a ``LlamaConfig``
   (4096 hidden, 32 layers, 32/8 heads, 14336 MLP, 128256 vocabulary; timing does not depend on the
   weight values), the time T(n) of ONE forward over n = 1..64 new tokens after a 512-token KV cache,
   at batch 1, 16 and 64, and T(n)/T(1): the cost of verifying n-1 drafts relative to one decode step.
   Each forward computes the logits of all n positions (a verify step needs them).  Eager Hugging Face
   forwards with a ``DynamicCache`` cropped back after each call (``specdec_lesson.profiling.crop_to``);
   CUDA events time each call, and the host time the forward call takes to return is recorded too
   (``enqueue_ms``): where it reaches 80% of the event time (``launch_bound``), the Python / kernel-launch
   side sets the pace (or the forward synchronises inside), and T(n)/T(1) is flatter than the GPU alone
   would give (CUDA graphs would lower T(1); not used here).

The JSON holds the machine (GPU name, memory, driver, CUDA, torch, triton, transformers versions,
date) and every section's rows; the CSV has one row per measurement with the machine columns.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                 rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                 tie_word_embeddings=False)
TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
                  rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  tie_word_embeddings=False)

GPU_PLAN = {
    "copy_bytes": 1 << 30,
    "curve": dict(config=LLAMA3_8B, dtype=torch.bfloat16, context=512, ns=list(range(1, 65)), batches=[1, 16, 64],
                  warmup=1, repeats=5),
    # (B, P prefix tokens, N tree nodes): chat-sized to long-context prefixes, small to large trees
    "tree": dict(H=32, Hkv=8, D=128, dtype=torch.bfloat16,
                 shapes=[(1, 1024, 16), (1, 4096, 64), (1, 16384, 64), (4, 4096, 64), (8, 2048, 128), (16, 4096, 64),
                         (32, 1024, 32)]),
}
DRY_PLAN = {
    "copy_bytes": 1 << 22,
    "curve": dict(config=TINY_LLAMA, dtype=torch.float32, context=16, ns=[1, 2, 3, 4], batches=[1, 2], warmup=1,
                  repeats=2),
    "tree": dict(H=2, Hkv=1, D=64, dtype=torch.float32, shapes=[(1, 27, 5), (2, 40, 8)]),
}

CSV_FIELDS = ["gpu", "date", "torch", "triton", "transformers", "section", "name", "config", "shape", "dtype", "batch", "n",
              "ms", "ratio_to_n1", "enqueue_ms", "launch_bound", "torch_ms", "speedup", "gbps", "copy_gbps", "frac_of_copy",
              "correct", "max_abs_err"]


# ---------------------------------------------------------------------------------- machine
def machine(device: str) -> dict:
    import transformers

    info = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": device, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "platform": platform.platform()}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001  (a broken triton install: say so, measure the rest)
        info["triton"] = f"unavailable ({type(exc).__name__})"
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm_count=p.multi_processor_count,
                    capability=f"{p.major}.{p.minor}")
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = q.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            info["nvidia_smi"] = None
    else:
        info["gpu"] = "none"
        info["cpu"] = platform.processor() or platform.machine()
    return info


# ----------------------------------------------------------------------------------- timers
def cuda_event_ms(fn: Callable[[], float], warmup: int, repeats: int) -> tuple[float, float]:
    """(median ms between CUDA events around ``fn``, median of the host ms ``fn`` returns: the time its
    call took to return, i.e. to enqueue the work unless the call synchronises inside)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host.append(fn())
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(gpu), statistics.median(host)


def wall_ms(fn: Callable[[], float], warmup: int, repeats: int) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    times, host = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        host.append(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), statistics.median(host)


# --------------------------------------------------------------------------------- sections
def section_copy(device: str, plan: dict, timer) -> dict:
    from specdec_lesson.kernels.bench import copy_bandwidth_gbps

    gbps = copy_bandwidth_gbps(device, timer, plan["copy_bytes"])
    return {"copy_gbps": gbps, "bytes": plan["copy_bytes"], "rows": [{"name": "tensor copy", "gbps": f"{gbps:.1f}",
                                                                       "shape": f"{plan['copy_bytes']} bytes"}]}


def section_kernels(device: str, dry: bool, timer, copy_gbps: float) -> dict:
    from specdec_lesson.kernels import bench as KB

    if dry:
        rows = KB.bench_verify(device, timer, KB.SMOKE_SIZES["verify"], copy_gbps, [(256, 4, 2, 2)])
        rows += KB.bench_attention(device, timer, KB.SMOKE_SIZES["attention"], copy_gbps, [(16, 32, 4)])
        rows += KB.bench_compact(device, timer, KB.SMOKE_SIZES["compact"], copy_gbps)
    else:
        rows = KB.bench_verify(device, timer, KB.GPU_SIZES["verify"], copy_gbps, KB.VERIFY_CONFIGS)
        rows += KB.bench_attention(device, timer, KB.GPU_SIZES["attention"], copy_gbps, KB.ATTENTION_CONFIGS)
        rows += KB.bench_compact(device, timer, KB.GPU_SIZES["compact"], copy_gbps)
    best = {}
    for r in rows:
        if r["correct"] and (r["kernel"] not in best or float(r["triton_ms"]) < float(best[r["kernel"]]["triton_ms"])):
            best[r["kernel"]] = r
    return {"rows": [_kernel_row(r) for r in rows], "best": {k: _kernel_row(v) for k, v in best.items()},
            "all_correct": all(r["correct"] for r in rows)}


def _kernel_row(r: dict) -> dict:
    return {"name": r["kernel"], "config": r["config"], "shape": r["shape"], "dtype": r["dtype"], "ms": r["triton_ms"],
            "torch_ms": r["torch_ms"], "speedup": r["speedup"], "gbps": r["triton_gbps"], "copy_gbps": r["copy_gbps"],
            "frac_of_copy": r["frac_of_copy"], "correct": r["correct"], "max_abs_err": r["max_abs_err"]}


def section_tree(device: str, plan: dict, dry: bool, timer, copy_gbps: float) -> dict:
    from specdec_lesson.kernels import bench as KB

    t = plan["tree"]
    configs = [(16, 32, 4)] if dry else KB.ATTENTION_CONFIGS
    rows, errors = [], []
    for B, P, N in t["shapes"]:
        size = dict(B=B, H=t["H"], Hkv=t["Hkv"], N=N, P=P, D=t["D"], dtype=t["dtype"])
        try:
            got = KB.bench_attention(device, timer, size, copy_gbps, configs)
        except Exception as exc:  # noqa: BLE001  (e.g. out of memory at one size: keep the others)
            errors.append(f"B={B},P={P},N={N}: {type(exc).__name__}: {str(exc)[:200]}")
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        if got:
            best = min(got, key=lambda r: float(r["triton_ms"]))
            rows += [{**_kernel_row(r), "best_for_shape": r is best} for r in got]
    return {"rows": rows, "errors": errors, "all_correct": all(r["correct"] for r in rows)}


def build_llama(config: dict, dtype: torch.dtype, device: str):
    """A random-weight LlamaForCausalLM of the given shape, built on the device (normal(0, 0.02) weights, unit norms)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**config)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters made in dtype directly: no fp32 copy of 8B weights on the way
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    # the rotary embedding's inv_freq buffer was built on meta (to_empty left it uninitialised): build it anew
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config).to(device)
    return model.eval()


def section_curve(device: str, plan: dict, budget_left: Callable[[], float]) -> dict:
    from transformers import DynamicCache

    from specdec_lesson.profiling import crop_to

    c = plan["curve"]
    t0 = time.perf_counter()
    model = build_llama(c["config"], c["dtype"], device)
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    timer = (lambda fn: cuda_event_ms(fn, c["warmup"], c["repeats"])) if device == "cuda" else \
        (lambda fn: wall_ms(fn, c["warmup"], c["repeats"]))
    ctx, vocab = c["context"], c["config"]["vocab_size"]
    import inspect  # transformers < 5.20 names the cache argument past_key_values, later ones cache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    g = torch.Generator(device="cpu").manual_seed(0)
    rows, skipped = [], []
    for B in c["batches"]:
        if budget_left() <= 0:
            skipped.append(f"batch {B}: time budget spent")
            continue
        prompt = torch.randint(0, vocab, (B, ctx), generator=g).to(device)  # [B, ctx]
        new = torch.randint(0, vocab, (B, max(c["ns"])), generator=g).to(device)  # [B, n_max]
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            pos = torch.arange(ctx, device=device).expand(B, -1)
            model(input_ids=prompt, position_ids=pos, use_cache=True, logits_to_keep=1, **{kw: cache})
            t1 = None
            for n in c["ns"]:
                ids = new[:, :n]
                pos_n = torch.arange(ctx, ctx + n, device=device).expand(B, -1)

                def fwd(ids=ids, pos_n=pos_n, cache=cache, model=model) -> float:
                    t = time.perf_counter()
                    model(input_ids=ids, position_ids=pos_n, use_cache=True, **{kw: cache})  # all n positions' logits
                    host_ms = (time.perf_counter() - t) * 1e3
                    crop_to(cache, ctx)  # metadata only (a view of the first ctx positions)
                    return host_ms

                ms, enqueue = timer(fwd)
                t1 = ms if n == 1 else t1
                rows.append({"name": "llama3-8b-shape" if c["config"] is LLAMA3_8B else "tiny-llama", "batch": B, "n": n,
                             "shape": f"B={B},n={n},context={ctx}", "dtype": str(c["dtype"]).replace("torch.", ""),
                             "ms": round(ms, 4), "enqueue_ms": round(enqueue, 4),
                             "ratio_to_n1": round(ms / t1, 4) if t1 else None,
                             "launch_bound": device == "cuda" and enqueue >= 0.8 * ms,
                             "config": "eager HF forward, DynamicCache cropped back"})
        cache = None
        if device == "cuda":
            torch.cuda.empty_cache()
    summary = {}
    for B in c["batches"]:
        pts = {r["n"]: r["ratio_to_n1"] for r in rows if r["batch"] == B}
        summary[f"batch_{B}"] = {f"T({n})/T(1)": pts.get(n) for n in (2, 4, 8, 16, 32, 64) if n in pts}
    model = None  # free the weights before the next section
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"rows": rows, "skipped_batches": skipped, "params": n_params, "build_s": round(build_s, 2), "summary": summary,
            "config": {k: v for k, v in c["config"].items()}, "context": ctx}


# ------------------------------------------------------------------------------------- main
def _gpu_verify():
    """benchmarks/gpu_verify.py (beside this file), loaded by path so that the suite runs from anywhere."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_verify", Path(__file__).resolve().parent / "gpu_verify.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(dry: bool, budget_s: float, sections: list[str]) -> dict:
    device = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    if not dry and device != "cuda":
        raise SystemExit("gpu_suite: no CUDA device; run it on the GPU machine, or use --dry-run for the CPU check")
    import specdec_lesson.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before triton is imported)

    plan = DRY_PLAN if dry else GPU_PLAN
    if device == "cuda":
        from specdec_lesson.kernels.bench import cuda_timer as timer
    else:
        from specdec_lesson.kernels.bench import wall_timer as timer
    start = time.perf_counter()

    def budget_left() -> float:
        return budget_s - (time.perf_counter() - start)

    res = {"suite": "specdec gpu_suite/1", "dry_run": dry, "machine": machine(device), "budget_s": budget_s,
           "definitions": __doc__, "sections": {}}
    copy_gbps = None
    for name in sections:
        if budget_left() <= 0:
            res["sections"][name] = {"skipped": f"time budget of {budget_s:.0f} s spent"}
            continue
        t0 = time.perf_counter()
        try:
            if name == "copy":
                out = section_copy(device, plan, timer)
                copy_gbps = out["copy_gbps"]
            elif name == "kernels":
                out = section_kernels(device, dry, timer, copy_gbps or section_copy(device, plan, timer)["copy_gbps"])
            elif name == "tree_attention":
                out = section_tree(device, plan, dry, timer, copy_gbps or section_copy(device, plan, timer)["copy_gbps"])
            elif name == "verify_curve":
                out = section_curve(device, plan, budget_left)
            elif name == "verify_grid":
                out = _gpu_verify().section_verify_grid(device, dry, timer,
                                                        copy_gbps or section_copy(device, plan, timer)["copy_gbps"])
            elif name == "bitexact":
                out = _gpu_verify().section_bitexact(device, dry)
            else:
                raise ValueError(f"unknown section {name!r}")
        except Exception as exc:  # noqa: BLE001  (one section failing must not cost the others)
            out = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}", "traceback": traceback.format_exc()}
            if device == "cuda":
                torch.cuda.empty_cache()
        out["seconds"] = round(time.perf_counter() - t0, 2)
        res["sections"][name] = out
        print(f"[gpu_suite] {name}: {out['seconds']} s" + (f"  ERROR {out['error']}" if "error" in out else ""), flush=True)
    res["seconds"] = round(time.perf_counter() - start, 2)
    return res


def write(res: dict, out_dir: Path) -> tuple[Path, Path]:
    m = res["machine"]
    slug = "cpu" if res["dry_run"] else re.sub(r"[^a-z0-9]+", "_", str(m.get("gpu")).lower()).strip("_")[:40] or "gpu"
    stamp = m["date"].replace(":", "").replace("-", "")[:15]
    stem = f"gpu_suite_{'dryrun_' if res['dry_run'] else ''}{slug}_{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, cpath = out_dir / f"{stem}.json", out_dir / f"{stem}.csv"
    jpath.write_text(json.dumps(res, indent=1, default=str))
    meta = {"gpu": m.get("gpu"), "date": m["date"], "torch": m["torch"], "triton": m.get("triton"),
            "transformers": m["transformers"]}
    with open(cpath, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for sec, body in res["sections"].items():
            for r in body.get("rows", []) if isinstance(body, dict) else []:
                w.writerow({**meta, "section": sec, **r})
    return jpath, cpath


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (Triton interpreter): checks the code paths")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the JSON and CSV (default benchmarks/results; a dry run: the temporary folder)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip sections that would start after this many seconds")
    ap.add_argument("--sections", default="copy,bitexact,verify_grid,kernels,tree_attention,verify_curve")
    a = ap.parse_args(argv)
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    res = run(a.dry_run, a.budget_s, sections)
    out = a.out or (Path(tempfile.gettempdir()) / "specdec_gpu_suite" if a.dry_run else RESULTS)
    jpath, cpath = write(res, out)
    bad = [n for n, b in res["sections"].items() if "error" in b or b.get("all_correct") is False]
    for n, b in res["sections"].items():
        if n == "verify_curve" and "summary" in b:
            print(f"[gpu_suite] T(n)/T(1): {json.dumps(b['summary'])}")
    print(f"[gpu_suite] {res['seconds']} s; wrote {jpath} and {cpath}" + (f"; problems in {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
