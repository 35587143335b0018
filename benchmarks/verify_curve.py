"""Verify-cost curve T(n) of the default target, plain vs pre-packed oneDNN linears (issue 5).

T(n) = median seconds of one SmolLM2-135M forward over n new tokens after a ``--context``-token KV
cache.  Speculative decoding with K drafted tokens pays T(K+1) per step instead of T(1) per token,
so the flatter T(n)/T(1), the larger the wall-clock speedup.  The script prints both curves, the
ratios T(8)/T(1), the largest logit difference pre-packing causes (fp32 rounding), whether greedy
decoding gives the same tokens, the machine's bandwidth / FLOP/s, and the per-forward framework
overhead (a tiny-width Llama's one-token forward), and writes ``benchmarks/results/verify_curve.json``.

    python benchmarks/verify_curve.py            # about 1 minute on a quiet 2-core CPU
    python benchmarks/verify_curve.py --repeats 9 --context 200 --threads 1

Run it on a quiet machine: timings taken while other processes compete for the cores are
unreliable (the JSON records the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from specdec_lesson.fastcpu import count_packed, packed_linear_available, prepack_linears, set_plain_rows, unpack_linears
from specdec_lesson.models import DEFAULT_TARGET_NAME, load_default_target
from specdec_lesson.profiling import (
    measure_bandwidth,
    measure_framework_overhead,
    measure_matmul_flops,
    measure_verify_curve,
)

RESULTS = Path(__file__).resolve().parent / "results" / "verify_curve.json"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def logits_for(model, ids: torch.Tensor, splits: list[int]) -> list[torch.Tensor]:
    """Full-sequence logits, then verify-style logits: prefill ids[:, :s] and one forward over the rest."""
    from transformers import DynamicCache

    out = []
    with torch.inference_mode():
        out.append(model(input_ids=ids).logits)  # [B, T, V]
        for s in splits:
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, :s], cache=cache, use_cache=True)
            pos = torch.arange(s, ids.shape[1]).unsqueeze(0)  # [1, T-s]
            out.append(model(input_ids=ids[:, s:], position_ids=pos, cache=cache, use_cache=True).logits)  # [B, T-s, V]
    return out


def greedy(model, prompt: torch.Tensor, steps: int) -> list[int]:
    """Plain cached greedy decoding (one token per forward)."""
    from transformers import DynamicCache

    tokens: list[int] = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits  # [1, 1, V]
        for _ in range(steps):
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
            tokens.append(int(nxt))
            logits = model(input_ids=nxt, cache=cache, use_cache=True).logits  # [1, 1, V]
    return tokens


def fmt_ms(curve: dict[int, float]) -> dict[str, float]:
    return {str(n): round(t * 1e3, 3) for n, t in curve.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-max", type=int, default=16)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    ap.add_argument("--greedy-steps", type=int, default=48)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_before = load_avg()
    ns = list(range(1, args.n_max + 1))

    model, tokenizer = load_default_target(verbose=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=g)  # [2, 64]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]  # [1, L]

    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; load {load_before}")
    busy = load_before is not None and load_before[0] > 0.5 * (os.cpu_count() or 1)
    if busy:
        print("WARNING: the machine is busy (1-minute load average above half the CPU count): these timings are unreliable; "
              "OpenMP threads that lose their core stall every parallel region (try --threads 1, or rerun when quiet)")
    plain_logits = logits_for(model, ids, [48, 56, 63])
    plain_greedy = greedy(model, prompt, args.greedy_steps)

    available = packed_linear_available()
    prepack_linears(model)
    packed_logits = logits_for(model, ids, [48, 56, 63])
    packed_greedy = greedy(model, prompt, args.greedy_steps)
    # the two curves interleaved, one round at a time, so a slow moment of the machine hits both alike:
    # the packed modules route every input through the plain weights while plain_rows_max exceeds its rows
    rounds: dict[str, dict[int, list[float]]] = {"plain": {n: [] for n in ns}, "packed": {n: [] for n in ns}}
    for _ in range(args.repeats):
        for name, rows in (("plain", 1 << 30), ("packed", 0)):
            set_plain_rows(model, rows)
            curve = measure_verify_curve(model, n_max=args.n_max, context=args.context, repeats=1, ns=ns)
            for n in ns:
                rounds[name][n].append(curve[n])
    plain = {n: statistics.median(v) for n, v in rounds["plain"].items()}
    packed = {n: statistics.median(v) for n, v in rounds["packed"].items()}
    n_packed = count_packed(model)
    unpack_linears(model)

    max_diff = max((a - b).abs().max().item() for a, b in zip(plain_logits, packed_logits))
    argmax_equal = all(torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(plain_logits, packed_logits))
    greedy_equal = sum(a == b for a, b in zip(plain_greedy, packed_greedy))
    bandwidth = measure_bandwidth(size_mb=256, repeats=5)
    flops = measure_matmul_flops(n=1024, repeats=5)
    overhead_1 = measure_framework_overhead(num_layers=1, context=args.context)
    overhead_30 = measure_framework_overhead(num_layers=model.config.num_hidden_layers, context=args.context)
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))

    print(f"\n{'n':>3} {'plain ms':>9} {'packed ms':>10} {'plain T(n)/T(1)':>16} {'packed T(n)/T(1)':>17}")
    for n in ns:
        print(f"{n:>3} {plain[n] * 1e3:9.1f} {packed[n] * 1e3:10.1f} {plain[n] / plain[1]:16.2f} {packed[n] / packed[1]:17.2f}")
    r8 = {}
    if 8 in ns:
        best1 = min(plain[1], packed[1])  # the fastest one-token forward: plain decoding's step on this machine
        r8 = {"plain": plain[8] / plain[1], "packed": packed[8] / packed[1],
              "best_over_best_t1": min(plain[8], packed[8]) / best1}
        print(f"\nT(8)/T(1): plain {r8['plain']:.3f}, packed {r8['packed']:.3f}; "
              f"fastest T(8) over the fastest T(1): {r8['best_over_best_t1']:.3f} (goal <= 1.25)")
    print(f"pre-packed oneDNN available: {available}; {n_packed} linears packed")
    print(f"max |logit diff| packed vs plain: {max_diff:.3g} (argmax equal everywhere: {argmax_equal})")
    print(f"greedy decoding, {args.greedy_steps} tokens: {greedy_equal}/{args.greedy_steps} equal")
    print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.0f} GFLOP/s; "
          f"linear weights {weight_bytes / 1e6:.0f} MB: decode-step memory roofline {weight_bytes / bandwidth * 1e3:.1f} ms")
    print(f"framework overhead of a one-token cached forward (tiny width): 1 layer {overhead_1 * 1e3:.2f} ms, "
          f"{model.config.num_hidden_layers} layers {overhead_30 * 1e3:.2f} ms")
    load_after = load_avg()
    elapsed = time.perf_counter() - t_start
    print(f"load average before {load_before}, after {load_after}; {elapsed:.0f} s")

    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": DEFAULT_TARGET_NAME,
        "machine": {
            "cpu": cpu_name(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_avg_before": load_before, "load_avg_after": load_after,
            "memory_bandwidth_bytes_per_s": bandwidth, "fp32_matmul_flops": flops,
        },
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "busy_at_start": busy,
        "settings": {"context": args.context, "repeats": args.repeats, "statistic": "median", "dtype": "float32"},
        "verify_curve_ms": {"plain": fmt_ms(plain), "prepacked": fmt_ms(packed)},
        "t8_over_t1": r8,
        "prepacked_available": available,
        "max_abs_logit_diff": max_diff,
        "argmax_equal": argmax_equal,
        "greedy_tokens_equal": [greedy_equal, args.greedy_steps],
        "linear_weight_bytes": weight_bytes,
        "framework_overhead_ms": {"1_layer": overhead_1 * 1e3, f"{model.config.num_hidden_layers}_layers": overhead_30 * 1e3},
        "median_ratio_packed_over_plain": statistics.median(packed[n] / plain[n] for n in ns),
        "elapsed_s": elapsed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
