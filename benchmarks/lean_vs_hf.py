"""The lean forward against Hugging Face's, on the default target: the verify curve and plain decoding.

    python benchmarks/lean_vs_hf.py                # ~6 min on 2 cores: benchmarks/results/lean_vs_hf_<cpu>.json
    python benchmarks/lean_vs_hf.py --quick        # seconds: tiny counts, to check the script

Both forwards run in their fastest form on this machine: Hugging Face's with ``profiling.tune_dispatch`` (plain
or pre-packed weights per forward width), the lean one with ``lean.tune_lean_dispatch``.  Then, interleaved
(round r measures every width on both forwards before round r+1 starts):

* ``curve``: T(n), one forward over n new tokens after a 128-token cache, n = 1..8 (median of the rounds);
* ``decode``: plain greedy decoding (``speculative.autoregressive_generate``) of held-out prompts of the four
  styles, each repeat's tokens paired with its own seconds; tokens/s per prompt, and the paired per-prompt ratio
  lean / HF with a t interval over prompts (``stats.paired_log_ratio``), the output checked equal;
* ``roofline``: the measured memory bandwidth (``profiling.measure_bandwidth``) and the bytes of the target's
  weights, so that T(1) / roofline can be read off.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_slug() -> str:
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    fam = next((ln.split(":")[1].strip() for ln in info.splitlines() if ln.startswith("cpu family")), "?")
    model = next((ln.split(":")[1].strip() for ln in info.splitlines() if ln.startswith("model\t")), "?")
    vendor = "amd" if "AMD" in info else "intel" if "Intel" in info else "cpu"
    return f"{vendor}_f{fam}_m{model}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny counts (a check of the script, not a measurement)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts-per-style", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="overwrite an existing results file")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.rounds < 1 or a.prompts_per_style < 1 or a.max_new < 1:
        ap.error("--threads, --rounds, --prompts-per-style and --max-new must be positive")
    out = a.out or RESULTS / f"lean_vs_hf_{cpu_slug()}{'_quick' if a.quick else ''}.json"
    if out.exists() and not a.force:
        ap.error(f"{out} exists: pass --force to overwrite it, or --out another path")
    if a.quick:
        a.rounds, a.prompts_per_style, a.max_new = 1, 1, 8
    torch.set_num_threads(a.threads)

    from specdec_lesson.bench.paired import percentile_interval
    from specdec_lesson.bench.tasks import chat, task_items
    from specdec_lesson.lean import lean_verify_curve, tune_lean_dispatch
    from specdec_lesson.models import load_default_target
    from specdec_lesson.profiling import count_parameters, measure_bandwidth, measure_verify_curve, tune_dispatch
    from specdec_lesson.speculative import autoregressive_generate

    target, tok = load_default_target("cpu", fast=True, verbose=False)
    hf_tuned = tune_dispatch(target, repeats=3, verbose=False)
    lean_tuned = tune_lean_dispatch(target, repeats=3)
    ns = list(range(1, 9))
    curve: dict[str, dict[int, list[float]]] = {"hf": {n: [] for n in ns}, "lean": {n: [] for n in ns}}
    prompts = []
    for style in ("code", "requests", "math", "chat"):
        for it in task_items(style, limit=a.prompts_per_style):
            prompts.append((style, it["id"], tok(chat(tok, it["text"]), add_special_tokens=False)["input_ids"]))
    decode: dict[str, dict[str, list]] = {f"{s}/{pid}": {"hf": [], "lean": []} for s, pid, _ in prompts}
    start = time.perf_counter()
    for r in range(a.rounds):
        for kind in ("hf", "lean") if r % 2 == 0 else ("lean", "hf"):  # alternate who goes first
            got = measure_verify_curve(target, context=128, repeats=1, ns=ns) if kind == "hf" else \
                {n: ts[0] for n, ts in lean_verify_curve(target, ns, 128, warmup=r == 0).items()}
            for n in ns:
                curve[kind][n].append(got[n] * 1e3)
        for style, pid, ids in prompts:
            for kind in ("hf", "lean") if r % 2 == 0 else ("lean", "hf"):
                x = torch.tensor([ids])
                t0 = time.perf_counter()
                new = autoregressive_generate(target, x, a.max_new, lean=kind == "lean")[0][0].tolist()
                sec = time.perf_counter() - t0
                decode[f"{style}/{pid}"][kind].append({"tokens": len(new), "seconds": sec, "ids": new})
        print(f"[lean_vs_hf] round {r + 1}/{a.rounds} done, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    bw = measure_bandwidth()
    weight_bytes = count_parameters(target) * 4
    med = {k: {n: statistics.median(v) for n, v in c.items()} for k, c in curve.items()}
    per_prompt, same = {}, True
    for key, d in decode.items():
        same &= all(x["ids"] == d["hf"][0]["ids"] for x in d["hf"] + d["lean"])
        per_prompt[key] = {k: statistics.median(x["tokens"] / x["seconds"] for x in d[k]) for k in ("hf", "lean")}
    logs = [math.log(v["lean"] / v["hf"]) for v in per_prompt.values()]
    boot = random.Random(0)
    means = [statistics.fmean(boot.choice(logs) for _ in logs) for _ in range(2000)]
    ci = percentile_interval([math.exp(m) for m in means])
    ratio = {"median_over_prompts": math.exp(statistics.median(logs)), "geomean": math.exp(statistics.fmean(logs)),
             "ci95_geomean": ci, "n_prompts": len(logs),
             "method": "per prompt: median over repeats of tokens/seconds (each repeat paired); ratio lean/HF per prompt; "
                       "percentile bootstrap over prompts of the geometric mean (2000 resamples; with few prompts it "
                       "covers less than its nominal 95%)"}
    res = {
        "what": __doc__.strip().splitlines()[0], "cpu": cpu_name(), "cpu_slug": cpu_slug(), "threads": a.threads,
        "torch": torch.__version__, "quick": a.quick, "rounds": a.rounds, "max_new": a.max_new,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "dispatch": {"hf_plain_rows_max": hf_tuned["plain_rows_max"], "lean_plain_rows_max": lean_tuned["plain_rows_max"]},
        "curve_ms": med, "curve_ms_rounds": curve,
        "T1_ms": {k: med[k][1] for k in med}, "T8_over_T1": {k: med[k][8] / med[k][1] for k in med},
        "roofline": {"bandwidth_gbps": bw / 1e9, "weight_bytes": weight_bytes, "roofline_ms": weight_bytes / bw * 1e3,
                     "T1_over_roofline": {k: med[k][1] / (weight_bytes / bw * 1e3) for k in med}},
        "decode_tokens_per_s": per_prompt, "decode_same_tokens": same,
        "decode_ratio_lean_over_hf": ratio,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    print(json.dumps({k: res[k] for k in ("cpu", "T1_ms", "T8_over_T1", "roofline", "decode_ratio_lean_over_hf",
                                           "decode_same_tokens")}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
