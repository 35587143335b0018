"""Token trees vs chains on the default pair (issue 6): tokens per target forward and wall-clock.

For held-out code (HumanEval eval split) and math prompts, greedy decoding (temperature 0 by
default) with the default pair measures

* tau (tokens emitted per target forward) of chains K = 1..8 (``speculative_generate``);
* tau of trees: EAGLE-2 dynamic trees of 4..64 nodes and two static shapes (``tree_generate``);
* seconds per token of each, and of plain decoding; the wall-clock speedup of the best tree and
  of the best chain over plain decoding, and best tree vs best chain,

and writes ``benchmarks/results/tree_vs_chain.json``.  Every run's output is checked to equal the
plain greedy output (pitfall 8: a mismatch is counted and reported, not hidden).

    python benchmarks/tree_vs_chain.py            # about 3-4 minutes on a 2-core CPU (1 thread)
    python benchmarks/tree_vs_chain.py --quick    # under 1 minute: fewer configs, shorter outputs

Every config runs ``--repeats`` times (default 3), interleaved in a rotated order; per prompt the median over
repeats.  The draft is ``specdec_lesson.drafters.pair.load_default_pair()`` (the shipped EAGLE-style drafter).  If
its weights are missing the script falls back to a self-draft made of the target's first
``--fallback-layers`` layers (untrained: low acceptance) and says so in the JSON.  Timings are
only meaningful on a quiet machine (the JSON records the load average before and after).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from specdec_lesson.bench.tasks import chat, code_problems, format_code_prompt, format_math_prompt, math_problems
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
    return pair.target, pair.tokenizer, lambda: EagleDrafter(model), "drafters.pair.load_default_pair() (EAGLE-style drafter)"


def prompts(tokenizer, n_code: int, n_math: int) -> list[dict]:
    items = [("code", p["task_id"], format_code_prompt(p)) for p in code_problems("eval")[:n_code]]
    items += [("math", p["id"], format_math_prompt(p)) for p in math_problems("eval")[:n_math]]
    return [{"task": t, "id": i, "ids": tokenizer(chat(tokenizer, text), add_special_tokens=False)["input_ids"]}
            for t, i, text in items]


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
    ap.add_argument("--prompts", type=int, default=2, help="prompts per task (code, math)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every config (median per prompt)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: with 2 threads on a shared 2-core CPU decoding ran 10-25x slower)")
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
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    target, tok, make_drafter, draft_desc = load_pair(args.fallback_layers, fast=not args.no_prepack)
    from specdec_lesson.fastcpu import count_packed

    prepacked = count_packed(target) > 0
    dispatch = getattr(target, "dispatch_profile", None)
    eos = tok.eos_token_id
    warm = prompts(tok, 1, 0)[0]["ids"]  # warm-up (first-call allocations, oneDNN primitive caches): not timed
    autoregressive_generate(target, [warm], 4)
    speculative_generate(target, make_drafter(), [warm], 4, k=2)
    tree_generate(target, make_drafter(), [warm], 4, tree=DynamicTree(depth=2, topk=2, num_nodes=4))
    by_task = {}
    for task in ("code", "math"):
        items = [it for it in prompts(tok, n_per, n_per) if it["task"] == task]
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
        for name in names[1:]:  # the speedup over plain within each repeat: its spread over the repeats
            per = [p / c for p, c in zip(res["plain"]["s_per_token_by_repeat"], res[name]["s_per_token_by_repeat"])]
            res[name]["speedup_range"] = [min(per), max(per)]
        for r in res.values():
            r.pop("outputs")
        plain = res["plain"]["s_per_token"]
        best_chain = min((n for n in res if n.startswith("chain")), key=lambda n: res[n]["s_per_token"])
        best_tree = min((n for n in res if not n.startswith(("chain", "plain"))), key=lambda n: res[n]["s_per_token"])
        by_task[task] = {
            "configs": res,
            "best_chain": best_chain, "best_tree": best_tree,
            "speedup_best_chain": plain / res[best_chain]["s_per_token"],
            "speedup_best_tree": plain / res[best_tree]["s_per_token"],
            "tree_vs_chain": res[best_chain]["s_per_token"] / res[best_tree]["s_per_token"],
        }
        print(f"[{task}] plain {plain * 1e3:.1f} ms/token")
        for n, r in res.items():
            ph = " ".join(f"{k} {v * 1e3:5.1f}" for k, v in r["s_per_token_by_phase"].items())
            print(f"  {n:16s} tau {r['tau']:.2f}  {r['s_per_token'] * 1e3:7.1f} ms/token ({ph})  "
                  f"equal {r['equal_to_plain']}/{r['n']}")
        print(f"  best chain {best_chain}: {by_task[task]['speedup_best_chain']:.2f}x; best tree {best_tree}: "
              f"{by_task[task]['speedup_best_tree']:.2f}x; tree/chain {by_task[task]['tree_vs_chain']:.2f}x")
    result = {
        "what": "tau (tokens per target forward) and wall-clock of chains vs token trees, greedy, default pair",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "draft": draft_desc, "target_prepacked": prepacked, "dispatch": dispatch, "max_new_tokens": max_new,
        "prompts_per_task": n_per, "repeats": args.repeats,
        "quick": args.quick, "trees": {n: repr(s) for n, s in trees.items()}, "tasks": by_task,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
