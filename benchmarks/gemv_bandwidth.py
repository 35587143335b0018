"""What separates one decode step from the memory roofline: how fast the one-row matrix products read weights.

    python benchmarks/gemv_bandwidth.py            # about 2 minutes: benchmarks/results/gemv_bandwidth_<cpu>.json
    python benchmarks/gemv_bandwidth.py --quick    # seconds: tiny counts, to check the script

The roofline of a decode step divides the weights' bytes by the machine's bandwidth, as STREAM measures it
(``profiling.measure_bandwidth``: copy and triad over 256 MB arrays, the best pass).  A one-token forward of
SmolLM2-135M reads its 538 MB as 120 separate matrices of 1.3 to 7 MB (QKV, O, gate/up and down of 30 layers)
and one of 113 MB (the LM head), each by one matrix-vector product.  This script times, interleaved over
``--rounds`` rounds at 1 and at ``--threads`` threads (medians):

* ``stream``: the STREAM figure the roofline uses;
* ``sum_one``: a plain read, ``sum`` over one tensor as large as the layers' weights;
* ``sum_layers``: the same bytes read as the layers' separate matrices, one ``sum`` each, in forward order;
* ``gemv_one``: one pre-packed one-row product (oneDNN, as the lean forward runs it) over ONE matrix holding all
  the layers' weights stacked;
* ``gemv_layers``: the lean forward's own pre-packed matrices, one product each, in forward order (its
  ``projections`` part, without the arithmetic between them);
* ``gemv_head``: the LM head alone;

and then one whole lean decode step taken apart (``lean.breakdown.decode_breakdown``, at the median STREAM figure):
projections, attention, LM head and the rest (norms, RoPE, cache writes, Python), each beside its floor.

Each figure is bytes read / seconds.  Where ``gemv_layers`` reads far slower than ``gemv_one``, the gap to the
roofline is not the product's arithmetic but the shape of the work: many small matrices, each started cold.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from lean_vs_hf import RESULTS, cpu_name, cpu_slug


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _args(argv: list[str] | None) -> argparse.Namespace:
    from specdec_lesson.cli_args import OneLineParser, UsageError

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny counts (a check of the script, not a measurement)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="overwrite an existing results file")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.rounds < 1:
        raise UsageError("--threads and --rounds must be positive")
    a.out = a.out or RESULTS / f"gemv_bandwidth_{cpu_slug()}{'_quick' if a.quick else ''}.json"
    if a.out.exists() and not a.force:
        raise UsageError(f"{a.out} exists: pass --force to overwrite it, or --out another path")
    if a.quick:
        a.rounds = 1
    return a


def main(argv: list[str] | None = None) -> int:
    from specdec_lesson.cli_args import UsageError

    try:
        a = _args(argv)
    except UsageError as exc:
        print(f"gemv_bandwidth.py: error: {exc}", file=sys.stderr)
        return 2
    out = a.out

    from specdec_lesson.bench.results import machine_info
    from specdec_lesson.fastcpu import _pack, _packed_linear
    from specdec_lesson.lean import lean_model
    from specdec_lesson.lean.breakdown import decode_breakdown
    from specdec_lesson.models import load_default_target
    from specdec_lesson.profiling import measure_bandwidth

    torch.set_num_threads(a.threads)
    target, _ = load_default_target("cpu", fast=True, verbose=False)  # pre-packed weights, as the engines run it
    lean = lean_model(target)
    if not lean.packed:
        sys.exit("gemv_bandwidth: this machine has no pre-packed (oneDNN) linears; nothing to measure")
    projs = [p for lay in lean.layers for p in (lay.qkv, lay.o, lay.gate_up, lay.down)]
    inputs = {n: torch.randn(1, n) for n in {p.weight.shape[1] for p in projs}}  # one row per input width
    layer_bytes = sum(p.weight.numel() for p in projs) * 4
    head_bytes = lean.lm_head.weight.numel() * 4
    by_width: dict[int, list[torch.Tensor]] = {}
    for p in projs:
        by_width.setdefault(p.weight.shape[1], []).append(p.weight)
    stacked = [(_pack(torch.cat(ws)), inputs[n]) for n, ws in by_width.items()]  # one matrix per input width
    flat = torch.cat([p.weight.reshape(-1) for p in projs])  # [all layer weights]
    xh = torch.randn(1, lean.hidden)

    tests = {
        "sum_one": (lambda: flat.sum(), layer_bytes),
        "sum_layers": (lambda: [p.weight.sum() for p in projs], layer_bytes),
        "gemv_one": (lambda: [_packed_linear(x, w, None) for w, x in stacked], layer_bytes),
        "gemv_layers": (lambda: [_packed_linear(inputs[p.weight.shape[1]], p.packed, None) for p in projs], layer_bytes),
        "gemv_head": (lambda: _packed_linear(xh, lean.lm_head.packed, None), head_bytes),
    }
    threads = sorted({1, a.threads})
    secs: dict[int, dict[str, list[float]]] = {t: {k: [] for k in tests} for t in threads}
    stream: dict[int, list[float]] = {t: [] for t in threads}
    with torch.inference_mode():
        for fn, _ in tests.values():  # warm-up
            fn()
        for r in range(a.rounds):  # interleaved: a slow moment of the machine hits every test alike
            for t in threads:
                torch.set_num_threads(t)
                stream[t].append(measure_bandwidth(repeats=1 if a.quick else 3))
                for name, (fn, _) in tests.items():
                    secs[t][name].append(_seconds(fn))
            print(f"round {r + 1}/{a.rounds} done", flush=True)
    torch.set_num_threads(a.threads)
    top = a.threads
    bw = statistics.median(stream[top])
    parts = decode_breakdown(target, bw, repeats=3 if a.quick else 15)
    gbps = {t: {"stream": statistics.median(stream[t]) / 1e9,
                **{k: tests[k][1] / statistics.median(v) / 1e9 for k, v in secs[t].items()}} for t in threads}
    ms = {t: {k: statistics.median(v) * 1e3 for k, v in secs[t].items()} for t in threads}
    res = {
        "what": __doc__.splitlines()[0],
        "cpu": cpu_name(), "cpu_slug": cpu_slug(), "machine": machine_info(), "threads": threads,
        "torch": torch.__version__, "quick": a.quick, "rounds": a.rounds,
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "bytes": {"layers": layer_bytes, "lm_head": head_bytes, "matrices": len(projs)},
        "gbps": {str(t): {k: round(v, 2) for k, v in d.items()} for t, d in gbps.items()},
        "ms": {str(t): {k: round(v, 3) for k, v in d.items()} for t, d in ms.items()},
        "layers_over_one": round(gbps[top]["gemv_layers"] / gbps[top]["gemv_one"], 3),
        "gemv_layers_over_stream": round(gbps[top]["gemv_layers"] / gbps[top]["stream"], 3),
        "breakdown": {"total_ms": round(parts["total_ms"], 3), "floor_ms": round(parts["floor_ms"], 3),
                      "parts": {k: {"ms": round(v["ms"], 3), "floor_ms": round(v["floor_ms"], 3)}
                                for k, v in parts["parts"].items()}, "bandwidth_gbps": round(bw / 1e9, 2)},
        "statistic": "median over interleaved rounds; GB/s = bytes read / seconds (1e9 bytes)",
    }
    print(json.dumps({k: res[k] for k in ("gbps", "layers_over_one", "gemv_layers_over_stream", "breakdown")}, indent=1))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
