"""Engine benchmark (issue 4): speedup of speculative_generate over autoregressive_generate for
K = 1..8 with the default draft, prompt lookup on an edit-style code prompt, and the engine's
own per-step overhead outside the models.

    python benchmarks/engine.py [--quick] [--out benchmarks/results/engine.json]

Overhead is measured, not estimated: forward hooks time every call of the target module, and
the drafter's ``propose``/``commit`` are timed as the draft's share; what is left of the wall
time (sampling, verification, rollback, bookkeeping, host syncs) is the engine's overhead.
Methods are interleaved per repeat; medians over repeats; warm-up excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec_lesson.bench.results import machine_info
from specdec_lesson.bench.tasks import chat, code_problems, format_code_prompt
from specdec_lesson.drafters import PromptLookupDrafter
from specdec_lesson.drafters.eagle import draft_identity
from specdec_lesson.drafters.pair import load_default_pair
from specdec_lesson.speculative import autoregressive_generate, speculative_generate

EDIT_PROMPT = (
    "Rename the variable `total` to `running_sum` in this function and return the whole function.\n\n"
    "```python\ndef mean_of_positive(values):\n    total = 0\n    count = 0\n    for v in values:\n"
    "        if v > 0:\n            total += v\n            count += 1\n    if count == 0:\n        return 0.0\n"
    "    return total / count\n```"
)


class Timer:
    """Accumulates seconds spent inside the target's forward calls and the drafter's methods.  The engines run the
    lean forward for the default target (``lean.path.uses_lean``): then its ``forward`` is the one timed (the Hugging
    Face module's hooks would never fire), else the module's forward hooks."""

    def __init__(self, target, drafter) -> None:
        from specdec_lesson.lean.model import lean_model
        from specdec_lesson.lean.path import uses_lean

        self.model = 0.0
        self.draft = 0.0
        self._t = 0.0
        self.forward = "lean" if uses_lean(target) else "hf"
        if self.forward == "lean":
            lean = lean_model(target)
            lean.forward = self._wrap(lean.forward, "model")  # this instance only: the engines call it
        else:
            target.register_forward_pre_hook(self._pre)
            target.register_forward_hook(self._post)
        if drafter is not None and not isinstance(drafter, torch.nn.Module):
            for name in ("propose", "commit", "begin"):
                setattr(drafter, name, self._wrap(getattr(drafter, name), "draft"))

    def _pre(self, *_):
        self._t = time.perf_counter()

    def _post(self, *_):
        self.model += time.perf_counter() - self._t

    def _wrap(self, fn, into: str):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                setattr(self, into, getattr(self, into) + time.perf_counter() - t)
        return timed

    def reset(self) -> None:
        self.model = self.draft = 0.0


def run(args) -> dict:
    pair = load_default_pair()
    target, drafter, tok = pair.target, pair.draft, pair.tokenizer
    timer = Timer(target, drafter)
    code = [chat(tok, format_code_prompt(p)) for p in code_problems("eval")[: args.prompts]]
    prompts = {"code": [tok(c, return_tensors="pt").input_ids for c in code],
               "edit": [tok(chat(tok, EDIT_PROMPT), return_tensors="pt").input_ids]}
    ks = [1, 2, 3, 4, 5, 6, 8] if not args.quick else [2, 4]
    methods = [("ar", None)] + [(f"chain-k{k}", k) for k in ks] + [("prompt-lookup-k4", "pl")]
    rows = []
    for task, ids_list in prompts.items():
        for ids in ids_list:
            autoregressive_generate(target, ids, 8)  # warm-up
            speculative_generate(target, drafter, ids, 8, k=4)
            per = {m: [] for m, _ in methods}
            for rep in range(args.repeats):
                order = methods[rep % len(methods):] + methods[: rep % len(methods)]
                for name, k in order:
                    if task == "edit" and isinstance(k, int) and k not in (4,):
                        continue
                    timer.reset()
                    t0 = time.perf_counter()
                    if k is None:
                        out, st = autoregressive_generate(target, ids, args.max_new_tokens)
                    elif k == "pl":
                        out, st = speculative_generate(target, PromptLookupDrafter(), ids, args.max_new_tokens, k=4)
                    else:
                        out, st = speculative_generate(target, drafter, ids, args.max_new_tokens, k=k)
                    wall = time.perf_counter() - t0
                    per[name].append({"wall": wall, "tokens": len(out[0]), "alpha": st.alpha, "tau": st.tau,
                                      "model_s": timer.model, "draft_s": timer.draft if k not in (None, "pl") else 0.0,
                                      "steps": st.row_steps, "text": out[0].tolist()})
            ar_runs = per["ar"]
            for name, runs in per.items():
                if not runs:
                    continue
                def med(key: str, runs=runs) -> float:
                    return statistics.median(r[key] for r in runs)

                tps = statistics.median(r["tokens"] / r["wall"] for r in runs)
                # paired: each repeat's tokens over its own seconds, over ar's in the same repeat; median over repeats
                speedup = statistics.median((r["tokens"] / r["wall"]) / (a["tokens"] / a["wall"])
                                            for r, a in zip(runs, ar_runs))
                overhead = statistics.median((r["wall"] - r["model_s"] - r["draft_s"]) / r["wall"] for r in runs)
                rows.append({"task": task, "method": name, "tokens_per_s": tps, "speedup": speedup,
                             "alpha": med("alpha"), "tau": med("tau"), "engine_overhead_fraction": overhead,
                             "draft_fraction": statistics.median(r["draft_s"] / r["wall"] for r in runs),
                             "same_text_as_ar": runs[0]["text"] == per["ar"][0]["text"]})
                print(f"{task:5s} {name:18s} {tps:7.1f} tok/s  x{speedup:4.2f}  alpha {med('alpha'):.2f}  "
                      f"tau {med('tau'):.2f}  engine overhead {100 * overhead:4.1f}%", flush=True)
    return {"rows": rows, "settings": vars(args), "forward": timer.forward,
            "statistics": "per prompt: tokens/s the median over repeats; speedup the median over repeats of the repeat's "
                          "tokens/s over ar's in the same repeat (greedy: every repeat emits the same tokens); engine "
                          "overhead = (wall - target forwards - drafter calls) / wall, median over repeats",
            "machine": {**machine_info(), "platform": platform.platform()}, "draft_weights": draft_identity(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default="benchmarks/results/engine.json")
    ap.add_argument("--force", action="store_true", help="replace an existing --out file")
    args = ap.parse_args()
    if min(args.prompts, args.repeats, args.max_new_tokens) < 1:
        ap.error("--prompts, --repeats and --max-new-tokens must be >= 1")
    if Path(args.out).exists() and not args.force:
        ap.error(f"{args.out} exists: pass --force to replace it, or choose another --out")
    if args.quick:
        args.prompts, args.repeats, args.max_new_tokens = 1, 1, 32
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)  # never a half-written results file
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
