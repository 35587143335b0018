"""Trees of lookup and draft candidates (``tree.hybrid.HybridTree``) against the best chain method, measured.

On held-out prompts of the benchmark's four styles (HumanEval-like code, free-form function requests, math word
problems, general chat; its own eval items), greedy, the default pair, this measures tau (tokens per target forward) and seconds
per token of

* plain decoding (the fastest plain forward on this machine: ``load_default_pair``'s dispatch);
* ``hybrid-suffix`` K = 4 (the draft chain or the answer lookup, per step: the best method of the headline run),
  with 8 (the bench's setting) and 12 lookup tokens;
* the draft's EAGLE-2 tree alone (8 nodes, depth 4);
* hybrid trees: the draft's tree and the answer lookup's continuation in ONE tree, over a few shapes (draft tree
  size and depth, lookup length 8 / 12 / 16, the tree drafted on a lookup step: the draft's top 2 at depth 1, a
  depth-2 tree, or the lookup chain alone, ``chain-only``),

interleaved (every config once per repeat, the order rotated), and writes ``benchmarks/results/hybrid_tree.json``
with each config's speedup over plain paired as the bench pairs it (``bench.paired``: the median over repeats of
each repeat's tokens over its own seconds, over plain decoding's in the same repeat) and its two-level bootstrap
interval, labelled with its n.
Every output is checked against the plain greedy output.

    python benchmarks/hybrid_tree.py               # about 15 minutes on a 2-core CPU
    python benchmarks/hybrid_tree.py --quick       # about 2 minutes: 1 prompt per style, fewer configs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from pathlib import Path

import torch
from tree_vs_chain import PHASES, paired, run_once, summarise

from specdec_lesson.bench.paired import CI_METHOD
from specdec_lesson.bench.results import machine_info
from specdec_lesson.bench.tasks import chat, task_items
from specdec_lesson.drafters.eagle import EagleDrafter, draft_identity
from specdec_lesson.drafters.hybrid import HybridDrafter
from specdec_lesson.drafters.suffix import CorpusLookupDrafter, default_answer_index
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.tree import DynamicTree, tree_generate
from specdec_lesson.tree.hybrid import HybridTree, HybridTreeDrafter

RESULTS = Path(__file__).resolve().parent / "results" / "hybrid_tree.json"
TASKS = ("code", "requests", "math", "chat")


def configs(quick: bool) -> dict[str, HybridTree]:
    top2 = DynamicTree(depth=1, topk=2, num_nodes=2)
    out = {
        "htree-8d4-L8": HybridTree(DynamicTree(depth=4, topk=4, num_nodes=8), lookup_len=8, with_lookup=top2),
        "htree-8d4-L12": HybridTree(DynamicTree(depth=4, topk=4, num_nodes=8), lookup_len=12, with_lookup=top2),
    }
    if not quick:
        out.update({
            "htree-8d4-L16": HybridTree(DynamicTree(depth=4, topk=4, num_nodes=8), lookup_len=16, with_lookup=top2),
            "htree-8d4-L8-chain-only": HybridTree(DynamicTree(depth=4, topk=4, num_nodes=8), lookup_len=8, with_lookup=None),
            "htree-6d3-L8": HybridTree(DynamicTree(depth=3, topk=4, num_nodes=6), lookup_len=8, with_lookup=top2),
            "htree-12d5-L8": HybridTree(DynamicTree(depth=5, topk=4, num_nodes=12), lookup_len=8, with_lookup=top2),
            "htree-8d4-L12-d2": HybridTree(DynamicTree(depth=4, topk=4, num_nodes=8), lookup_len=12,
                                           with_lookup=DynamicTree(depth=2, topk=2, num_nodes=3)),
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 prompt per style, 48 tokens, fewer configs")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per style")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every config (median per prompt)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if min(args.repeats, args.prompts, args.max_new, args.threads) < 1:
        ap.error("--repeats, --prompts, --max-new and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    max_new, n_per = (min(48, args.max_new), 1) if args.quick else (args.max_new, args.prompts)
    trees = configs(args.quick)
    load0 = os.getloadavg()
    from specdec_lesson.drafters.pair import load_default_pair

    pair = load_default_pair()
    target, tok, model = pair.target, pair.tokenizer, pair.draft.model
    eos = tok.eos_token_id
    index = default_answer_index()
    items_of = {t: [{"task": t, "id": it["id"], "ids": tok(chat(tok, it["text"]), add_special_tokens=False)["input_ids"]}
                    for it in task_items(t, n_per)] for t in TASKS}
    def eagle() -> EagleDrafter:  # pre-packed and routed per width as the target (EagleDrafter's dispatch_like)
        return EagleDrafter(model, dispatch_like=target)

    fns = {
        "plain": lambda ids: autoregressive_generate(target, ids, max_new, eos_token_id=eos),
        "hybrid-suffix-k4": lambda ids: speculative_generate(
            target, HybridDrafter(eagle(), lookup_k=8, lookup=CorpusLookupDrafter(index)), ids, max_new,
            k=4, eos_token_id=eos),
        "hybrid-suffix-k4-L12": lambda ids: speculative_generate(
            target, HybridDrafter(eagle(), lookup_k=12, lookup=CorpusLookupDrafter(index)), ids, max_new,
            k=4, eos_token_id=eos),
        "tree-8d4": lambda ids: tree_generate(target, eagle(), ids, max_new,
                                              tree=DynamicTree(depth=4, topk=4, num_nodes=8), eos_token_id=eos),
    }
    for name, spec in trees.items():
        fns[name] = lambda ids, s=spec: tree_generate(
            target, HybridTreeDrafter(eagle(), lookup=CorpusLookupDrafter(index)), ids, max_new, tree=s,
            eos_token_id=eos)
    warm = items_of["code"][0]["ids"]
    for fn in fns.values():  # warm-up (allocations, oneDNN primitive caches): not timed
        fn([warm[:64]])
    names = list(fns)
    by_task = {}
    for task in TASKS:
        passes: dict[str, list] = {n: [] for n in names}
        for rep in range(args.repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                passes[name].append(run_once(fns[name], items_of[task]))
        res = {"plain": summarise(passes["plain"])}
        ref = res["plain"]["outputs"]
        for name in names[1:]:
            res[name] = summarise(passes[name], ref)
            res[name].update(paired(passes[name], passes["plain"]))
        for r in res.values():
            r.pop("outputs")
        best = max(names[1:], key=lambda n: res[n]["speedup"])
        by_task[task] = {"configs": res, "best": best, "prompts": [it["id"] for it in items_of[task]]}
        print(f"[{task}] plain {res['plain']['s_per_token'] * 1e3:.1f} ms/token")
        for n in names[1:]:
            r = res[n]
            ph = " ".join(f"{k} {r['s_per_token_by_phase'][k] * 1e3:5.1f}" for k in PHASES)
            ci = r["speedup_ci"] or [float("nan")] * 2
            print(f"  {n:18s} tau {r['tau']:.2f}  {r['speedup']:.2f}x [{ci[0]:.2f}-{ci[1]:.2f}]  ({ph})  "
                  f"equal {r['equal_to_plain']}/{r['n']}")
    summary = {n: statistics.median(by_task[t]["configs"][n]["speedup"] for t in TASKS) for n in names[1:]}
    result = {
        "what": "hybrid trees (draft tree + answer-lookup continuation in one tree) vs hybrid-suffix and the draft's "
                "tree, greedy, default pair; speedup over plain decoding, paired per repeat (same run)",
        "statistics": f"speedup: bench.paired's median over repeats of each repeat's paired throughput ratio over "
                      f"plain decoding; interval: {CI_METHOD}, nominal 95% (below nominal with few prompts: "
                      "interval_coverage.json); greedy, so the repeats of a prompt emit the same tokens",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "draft_weights": draft_identity(),
        "dispatch": getattr(target, "dispatch_profile", None), "max_new_tokens": max_new, "prompts_per_task": n_per,
        "repeats": args.repeats, "quick": args.quick, "trees": {n: repr(s) for n, s in trees.items()},
        "median_speedup_over_tasks": summary, "tasks": by_task,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("median over styles: " + ", ".join(f"{n} {v:.2f}x" for n, v in summary.items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
