"""Two drafts in one run: did replacing the shipped draft make decoding faster, on this machine, now?

    python benchmarks/draft_ab.py --old runs/stage3 --out benchmarks/results/draft_ab_intel.json

The benchmark files of two drafts made on different days compare the drafts *and* the machine's state (a shared
2-core host can be a third slower one day than the next). This run removes the second: the shipped draft and an
earlier one (``--old``, a folder with ``eagle_smollm2.safetensors`` / ``.json``) decode the same held-out prompts of
the four styles (``bench.tasks``, the headline's prompts), greedy, K = 4, by the draft alone (``chain``) and by the
default ``adaptive`` method, interleaved with plain decoding (``ar``) in every repeat, the order rotating by prompt
and repeat. Each speedup is paired per repeat (``bench.paired``: a repeat's tokens over its own seconds, over the
base's in the same repeat; the median over repeats), with the two-level bootstrap interval (nominal 95%, covering
less with few prompts: ``interval_coverage.json``). Besides each method's speedup over ``ar``, the file gives the new
draft over the old one directly (``new_over_old``: base = the old draft's run of the same method, prompt and repeat).
The adaptive method measures each draft's own step costs before the timed runs, as the bench does.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from pathlib import Path

from specdec_lesson.bench.metrics import pooled_acceptance
from specdec_lesson.bench.paired import CI_METHOD, paired_cells, paired_task_speedup, two_level_bootstrap_ci
from specdec_lesson.bench.results import machine_info, write_results
from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_NAME, draft_identity

TASKS = ("code", "requests", "math", "chat")
METHODS = ("chain", "adaptive")


def check_args(a: argparse.Namespace) -> None:
    """Every input checked before the model loads: one error line naming the problem and the fix."""
    for suffix in (".safetensors", ".json"):
        if not (a.old / f"{DEFAULT_DRAFT_NAME}{suffix}").is_file():
            sys.exit(f"draft_ab.py: error: --old {a.old} has no {DEFAULT_DRAFT_NAME}{suffix}; give the folder of an "
                     "exported draft (distill export --dest DIR)")
    if draft_identity(a.old) == draft_identity():
        sys.exit(f"draft_ab.py: error: --old {a.old} holds the shipped draft itself; give an earlier draft's folder")
    if a.prompts < 2 or a.repeats < 2 or a.k < 1 or a.max_new < 1:
        sys.exit("draft_ab.py: error: --prompts and --repeats must be >= 2 (an interval needs two prompts, a pairing "
                 "two repeats), --k and --max-new >= 1")
    if a.out.exists() and not a.force:
        sys.exit(f"draft_ab.py: error: {a.out} exists; pass --force to replace it, or choose another --out")


def summarise(runs: list[dict]) -> dict:
    out: dict = {}
    for task in TASKS:
        t: dict = {}
        ar0 = {r["prompt_id"]: r["tokens"] for r in runs if r["task"] == task and r["label"] == "ar" and r["repeat"] == 0}
        for label in sorted({r["label"] for r in runs if r["task"] == task} - {"ar"}):
            cells = paired_cells(runs, task, label)
            mine = [r for r in runs if r["task"] == task and r["label"] == label]
            acc = pooled_acceptance(r["stats"] for r in mine if r["repeat"] == 0)  # greedy repeats replay the same
            same = [r["tokens"] == ar0.get(r["prompt_id"]) for r in mine if r["repeat"] == 0]
            t[label] = {"speedup": paired_task_speedup(cells), "speedup_ci": two_level_bootstrap_ci(cells),
                        "alpha": acc["alpha"], "tau": acc["tau"], "same_as_ar": sum(same) / len(same),
                        "n": f"{len(cells)}x{max((len(c) for c in cells.values()), default=0)}"}
        for m in METHODS:
            cells = paired_cells(runs, task, f"{m}-k4@new", base=f"{m}-k4@old")
            t[f"{m}_new_over_old"] = {"ratio": paired_task_speedup(cells), "ci": two_level_bootstrap_ci(cells)}
        out[task] = t
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="folder of the earlier draft (eagle_smollm2.*)")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts per style")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/draft_ab.json"))
    ap.add_argument("--force", action="store_true", help="replace an existing --out file")
    a = ap.parse_args(argv)
    check_args(a)

    import torch

    from specdec_lesson.bench import tasks as T
    from specdec_lesson.bench.methods import _adaptive_costs
    from specdec_lesson.bench.runner import BenchSettings, _run_one, load_models
    from specdec_lesson.drafters.eagle import EagleDrafter, load_draft

    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()
    new = load_models("default")
    old = dataclasses.replace(new, draft=EagleDrafter(load_draft(new.target, a.old), dispatch_like=new.target), notes=[])
    pairs = {"new": new, "old": old}
    s = BenchSettings(tasks=list(TASKS), methods=["ar", *METHODS], ks=[a.k], max_new_tokens=a.max_new,
                      repeats=a.repeats, warmup=1, limit=a.prompts)
    s.validate()
    for lo in pairs.values():
        _adaptive_costs(lo)  # each draft's own step costs, measured before any timed run
    labels = [("ar", "new", "ar", None)] + [(f"{m}-k{a.k}@{w}", w, m, a.k) for m in METHODS for w in pairs]
    items = {t: T.task_items(t, a.prompts, None) for t in TASKS}
    first = new.encode(items[TASKS[0]][0]["text"])
    for _, w, m, k in labels:  # warm-up, excluded
        _run_one(pairs[w], m, k, first, s, seed=0)
    runs = []
    for ti, task in enumerate(TASKS):
        for pi, item in enumerate(items[task]):
            ids = new.encode(item["text"])
            for r in range(a.repeats):
                shift = (pi * a.repeats + r) % len(labels)
                for label, w, m, k in labels[shift:] + labels[:shift]:
                    t0 = time.perf_counter()
                    toks, stats = _run_one(pairs[w], m, k, ids, s, seed=ti * 1000 + pi * 10 + r)
                    wall = time.perf_counter() - t0
                    runs.append({"task": task, "prompt_id": item["id"], "label": label, "repeat": r, "wall_s": wall,
                                 "new_tokens": len(toks), "stats": stats, "tokens": toks})
            print(f"[{task}] prompt {pi + 1}/{len(items[task])} done", flush=True)
    summary = summarise(runs)
    for task, t in summary.items():
        print(f"{task:9s} " + "  ".join(f"{lab} {v['speedup']:.2f}x a={v['alpha'] or 0:.2f}" for lab, v in t.items()
                                         if "speedup" in v)
              + "  new/old: " + " ".join(f"{m} {t[f'{m}_new_over_old']['ratio']:.3f}" for m in METHODS), flush=True)
    result = {
        "what": "the shipped draft against an earlier one in one run: chain and adaptive with each, interleaved with "
                "plain decoding, greedy, held-out prompts of four styles",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "drafts": {"new": draft_identity(), "old": {**draft_identity(a.old), "folder": str(a.old)}},
        "dispatch": new.info.get("dispatch"), "notes": new.notes, "k": a.k, "max_new_tokens": a.max_new,
        "prompts_per_task": a.prompts, "repeats": a.repeats,
        "statistics": f"speedup: bench.paired's median over repeats of the repeat's paired throughput ratio; interval: "
                      f"{CI_METHOD}, nominal 95% (below nominal with few prompts: interval_coverage.json); alpha "
                      "pooled over repeat 0 (greedy: the repeats emit the same tokens)",
        "summary": summary,
        "runs": [{k: v for k, v in r.items() if k != "tokens" or r["repeat"] == 0} for r in runs],
    }
    write_results(result, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
