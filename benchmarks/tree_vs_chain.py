"""Token trees vs chains on the default pair (issue 6): tokens per target forward and wall-clock.

For held-out prompts of the benchmark's four styles (HumanEval-like code, free-form function requests, math word
problems, general chat: ``bench.tasks.task_items``), greedy decoding with the default pair measures

* tau (tokens emitted per target forward) of chains K = 1..8 (``speculative_generate``);
* tau of trees: EAGLE-2 dynamic trees of 4..64 nodes and two static shapes (``tree_generate``);
* seconds per token of each, and of plain decoding; each config's speedup over plain decoding, paired as the
  bench pairs it (``bench.paired``: each repeat's tokens over its own seconds, over plain decoding's in the same
  repeat; the median over repeats; a two-level bootstrap interval, labelled with its n); the best tree and the best
  chain, and best tree vs best chain,

and writes ``benchmarks/results/tree_vs_chain.json``.  Every run's output is checked to equal the
plain greedy output (pitfall 8: a mismatch is counted and reported, not hidden).

    python benchmarks/tree_vs_chain.py            # about 7 minutes on a 2-core CPU (2 threads)
    python benchmarks/tree_vs_chain.py --quick    # about 1 minute: fewer configs, shorter outputs

Every config runs ``--repeats`` times (default 3), interleaved in a rotated order.  The draft is
``specdec_lesson.drafters.pair.load_default_pair()`` (the shipped EAGLE-style drafter).  If its weights are missing
the script falls back to a self-draft made of the target's first ``--fallback-layers`` layers (untrained: low
acceptance) and says so in the JSON.  Timings are only meaningful on a quiet machine (the JSON records the load
average before and after).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import torch

from specdec_lesson.bench.paired import CI_METHOD, paired_task_speedup, prompt_speedup, two_level_bootstrap_ci
from specdec_lesson.bench.results import machine_info
from specdec_lesson.bench.tasks import chat, task_items
from specdec_lesson.drafters.eagle import draft_identity
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.tree import DynamicTree, StaticTree, tree_generate

RESULTS = Path(__file__).resolve().parent / "results" / "tree_vs_chain.json"


def load_pair(fallback_layers: int, fast: bool):
    """(target, tokenizer, make_drafter, description).  The target is pre-packed (``fast``) with each forward width
    routed to the faster of plain and packed weights on this machine (``load_default_pair``'s tuning)."""
    from specdec_lesson.drafters.eagle import EagleDrafter
    from specdec_lesson.drafters.pair import load_default_pair

    try:
        pair = load_default_pair(fast=fast)
    except (FileNotFoundError, OSError) as exc:  # the shipped draft's weights are missing or unreadable
        import copy

        from specdec_lesson.models import load_default_target

        target, tok = load_default_target(fast=fast)
        draft = copy.deepcopy(target)
        draft.model.layers = draft.model.layers[:fallback_layers]
        draft.config.num_hidden_layers = fallback_layers
        desc = f"FALLBACK (no EAGLE draft: {type(exc).__name__}: {exc}): the target's first {fallback_layers} layers + head"
        return target, tok, lambda: draft, desc
    model = pair.draft.model
    target = pair.target
    desc = "drafters.pair.load_default_pair() (EAGLE-style drafter, pre-packed like the target)"
    return target, pair.tokenizer, lambda: EagleDrafter(model, dispatch_like=target), desc


TASKS = ("code", "requests", "math", "chat")


def prompts(tokenizer, task: str, n: int) -> list[dict]:
    """The first ``n`` held-out items of ``task`` (the benchmark's own), tokenized with the chat template."""
    return [{"task": task, "id": it["id"], "ids": tokenizer(chat(tokenizer, it["text"]), add_special_tokens=False)["input_ids"]}
            for it in task_items(task, n)]


def paired(passes: list[list[dict]], plain: list[list[dict]]) -> dict:
    """A config's speedup over plain decoding from the repeats of both (``run_once`` lists over the same items, repeat
    r of each taken in the same interleaved round): ``bench.paired``'s median over repeats of the repeat's tokens /
    seconds over plain's, its two-level bootstrap interval, and the per-prompt speedups (median over repeats)."""
    cells = {j: {r: (len(p[j]["tokens"]), p[j]["s"], len(b[j]["tokens"]), b[j]["s"])
                 for r, (p, b) in enumerate(zip(passes, plain))} for j in range(len(passes[0]))}
    return {"speedup": paired_task_speedup(cells), "speedup_ci": two_level_bootstrap_ci(cells),
            "speedup_by_prompt": [prompt_speedup(c) for c in cells.values()],
            "sample": f"{len(cells)} prompts x {len(passes)} repeats"}


def run_once(fn, items) -> list[dict]:
    """One timed pass of ``fn(ids) -> (tokens, stats)`` over the items: per item its output, seconds, counters."""
    out = []
    for it in items:
        t0 = time.perf_counter()
        tokens, stats = fn([it["ids"]])
        dt = time.perf_counter() - t0
        out.append({"tokens": tokens[0].tolist(), "s": dt, "emitted": stats.emitted, "steps": stats.row_steps,
                    "parts": {k: getattr(stats, f"time_{k}") for k in PHASES}})
    return out


PHASES = ("draft", "verify", "other", "prefill")


def summarise(passes: list[list[dict]], reference=None) -> dict:
    """A config's repeats (each a ``run_once`` list): tau, seconds per token (per item the median over repeats,
    then the mean over items), per-repeat seconds per token, equality with the plain outputs (repeat 0)."""
    first = passes[0]
    n = len(first)
    per_item = [statistics.median(p[j]["s"] / max(len(p[j]["tokens"]), 1) for p in passes) for j in range(n)]
    per_rep = [statistics.mean(x["s"] / max(len(x["tokens"]), 1) for x in p) for p in passes]
    emitted = sum(x["emitted"] for p in passes for x in p)
    steps = sum(x["steps"] for p in passes for x in p)
    parts = {k: sum(x["parts"][k] for p in passes for x in p) / max(emitted, 1) for k in PHASES}
    equal = sum(reference is None or first[j]["tokens"] == reference[j] for j in range(n))
    return {"tau": emitted / steps if steps else float("nan"), "s_per_token": statistics.mean(per_item),
            "s_per_token_by_repeat": per_rep, "equal_to_plain": equal, "n": n,
            "outputs": [x["tokens"] for x in first], "s_per_token_by_phase": parts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 prompt per task, 32 tokens, fewer configs")
    ap.add_argument("--max-new", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per style (code, requests, math, chat)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every config (median per prompt)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (timings need a quiet machine)")
    ap.add_argument("--no-prepack", action="store_true", help="do not pre-pack the target's linears (fastcpu)")
    ap.add_argument("--fallback-layers", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    max_new, n_per = (min(32, args.max_new), 1) if args.quick else (args.max_new, args.prompts)
    chains = [1, 2, 4, 6] if args.quick else list(range(1, 9))
    sizes = [(8, 4), (32, 6)] if args.quick else [(4, 3), (8, 4), (16, 4), (32, 6), (64, 6)]  # (nodes, depth)
    trees = {f"dynamic-{n}-d{d}": DynamicTree(depth=d, topk=4, num_nodes=n) for n, d in sizes}
    if not args.quick:
        trees.update({"static-2-2-1-1": StaticTree((2, 2, 1, 1)), "static-4-2-2-1": StaticTree((4, 2, 2, 1))})
    load0 = os.getloadavg()
    if min(args.repeats, args.prompts, args.max_new, args.threads) < 1:
        ap.error("--repeats, --prompts, --max-new and --threads must be >= 1")
    target, tok, make_drafter, draft_desc = load_pair(args.fallback_layers, fast=not args.no_prepack)
    from specdec_lesson.fastcpu import count_packed

    prepacked = count_packed(target) > 0
    dispatch = getattr(target, "dispatch_profile", None)
    eos = tok.eos_token_id
    warm = prompts(tok, "code", 1)[0]["ids"]  # warm-up (first-call allocations, oneDNN primitive caches): not timed
    autoregressive_generate(target, [warm], 4)
    speculative_generate(target, make_drafter(), [warm], 4, k=2)
    tree_generate(target, make_drafter(), [warm], 4, tree=DynamicTree(depth=2, topk=2, num_nodes=4))
    by_task = {}
    for task in TASKS:
        items = prompts(tok, task, n_per)
        fns = {"plain": lambda ids: autoregressive_generate(target, ids, max_new, eos_token_id=eos)}
        for k in chains:
            fns[f"chain-{k}"] = lambda ids, k=k: speculative_generate(target, make_drafter(), ids, max_new, k=k,
                                                                      eos_token_id=eos)
        for name, spec in trees.items():
            fns[name] = lambda ids, s=spec: tree_generate(target, make_drafter(), ids, max_new, tree=s, eos_token_id=eos)
        names = list(fns)
        passes: dict[str, list] = {n: [] for n in names}
        for rep in range(args.repeats):  # interleaved: every config once per repeat, the order rotated
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                passes[name].append(run_once(fns[name], items))
        res = {"plain": summarise(passes["plain"])}
        ref = res["plain"]["outputs"]
        for name in names[1:]:
            res[name] = summarise(passes[name], ref)
        for name in names[1:]:
            res[name].update(paired(passes[name], passes["plain"]))
        for r in res.values():
            r.pop("outputs")
        plain = res["plain"]["s_per_token"]
        best_chain = max((n for n in res if n.startswith("chain")), key=lambda n: res[n]["speedup"])
        best_tree = max((n for n in res if not n.startswith(("chain", "plain"))), key=lambda n: res[n]["speedup"])
        by_task[task] = {
            "configs": res, "prompts": [it["id"] for it in items],
            "best_chain": best_chain, "best_tree": best_tree,
            "speedup_best_chain": res[best_chain]["speedup"],
            "speedup_best_tree": res[best_tree]["speedup"],
            "tree_vs_chain": res[best_tree]["speedup"] / res[best_chain]["speedup"],
        }
        print(f"[{task}] plain {plain * 1e3:.1f} ms/token")
        for n, r in res.items():
            ph = " ".join(f"{k} {v * 1e3:5.1f}" for k, v in r["s_per_token_by_phase"].items())
            ci = r.get("speedup_ci") or [float("nan")] * 2
            print(f"  {n:16s} tau {r['tau']:.2f}  {r['s_per_token'] * 1e3:7.1f} ms/token ({ph})  "
                  f"{r.get('speedup', 1.0):.2f}x [{ci[0]:.2f}-{ci[1]:.2f}]  equal {r['equal_to_plain']}/{len(items)}")
        print(f"  best chain {best_chain}: {by_task[task]['speedup_best_chain']:.2f}x; best tree {best_tree}: "
              f"{by_task[task]['speedup_best_tree']:.2f}x; tree/chain {by_task[task]['tree_vs_chain']:.2f}x")
    result = {
        "what": "tau (tokens per target forward) and wall-clock of chains vs token trees, greedy, default pair",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "draft_weights": draft_identity(),
        "statistics": f"speedup: bench.paired's median over repeats of each repeat's paired throughput ratio over "
                      f"plain decoding; interval: {CI_METHOD}, nominal 95% (below nominal with few prompts: "
                      "interval_coverage.json); greedy, so the repeats of a prompt emit the same tokens",
        "draft": draft_desc, "target_prepacked": prepacked, "dispatch": dispatch, "max_new_tokens": max_new,
        "prompts_per_task": n_per, "repeats": args.repeats,
        "quick": args.quick, "trees": {n: repr(s) for n, s in trees.items()}, "tasks": by_task,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
