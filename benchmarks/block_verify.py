"""What block verification buys on the real pair (lever 3 of the speed work), measured two ways.

Block verification (``verify="block"``, Sun et al. 2024) is exact and never accepts fewer drafts *in expectation*
than the token-level rule; greedy runs are unchanged (one-hot draft laws), so its gain lives at T > 0.  On held-out
prompts of the benchmark's four styles (code, free-form requests, math word problems, general chat; its own eval
items), the default pair, the draft alone (chain, K drafts per step), this measures at each temperature:

* **the paired, low-noise measure**: at every verified step of every run, E[accepted drafts | the drafted block]
  under *both* rules (``verify.expected_accepted_given_drafts``: each rule's own random tests integrated out), so
  the two rules are scored on the same blocks; the mean per step and the block / token ratio;
* **the counted one**: tau (tokens per target forward) and seconds per token of ``speculative_generate`` with
  ``verify="token"`` and with ``verify="block"``, interleaved (the two rules alternate per prompt and seed), and the
  wall-clock ratio.  The hook's own time is subtracted from each run.

Both ratios are paired as the bench pairs its speedups (``bench.paired``): a (prompt, seed) is one cell holding the
block rule's run and the token rule's run of that seed (different samples at T > 0: each run's tokens go with its
own seconds); the figure is the median over seeds of the cells' pooled ratio, the interval a two-level bootstrap
(prompts, then seeds), nominal 95%, with its n stated; with 4 prompts per style it covers less than 95%
(``interval_coverage.json``).

Writes ``benchmarks/results/block_verify.json``.

    python benchmarks/block_verify.py            # about 15 minutes on a 2-core CPU (2 threads)
    python benchmarks/block_verify.py --quick    # about 1 minute: 1 prompt per style, T = 1, 32 tokens
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import torch

from specdec_lesson.bench.paired import CI_METHOD, paired_task_speedup, two_level_bootstrap_ci
from specdec_lesson.bench.results import machine_info, write_results
from specdec_lesson.bench.tasks import chat, task_items
from specdec_lesson.drafters.eagle import EagleDrafter, draft_identity
from specdec_lesson.speculative import speculative_generate
from specdec_lesson.verify import VERIFY_RULES, expected_accepted_given_drafts

RESULTS = Path(__file__).resolve().parent / "results" / "block_verify.json"
TASKS = ("code", "requests", "math", "chat")


def run(target, model, ids: list[int], max_new: int, k: int, temperature: float, seed: int, rule: str, eos) -> dict:
    """One generation with rule ``rule``; every verified block scored under both rules by the hook."""
    scored = {r: [] for r in VERIFY_RULES}
    hook_s = [0.0]

    def observe(target_probs, draft_probs, draft_tokens):  # [1, K+1, V], [1, K, V], [1, K]
        t = time.perf_counter()
        for r in VERIFY_RULES:
            scored[r].append(float(expected_accepted_given_drafts(target_probs, draft_probs, draft_tokens, r)[0]))
        hook_s[0] += time.perf_counter() - t

    gen = torch.Generator().manual_seed(seed)
    drafter = EagleDrafter(model, dispatch_like=target)
    t0 = time.perf_counter()
    out, stats = speculative_generate(target, drafter, [ids], max_new, k=k, temperature=temperature, generator=gen,
                                      eos_token_id=eos, verify=rule, observe=observe)
    wall = time.perf_counter() - t0 - hook_s[0]
    return {"tokens": len(out[0]), "s": wall, "steps": stats.row_steps, "emitted": stats.emitted,
            "accepted": stats.accepted, "proposed": stats.proposed, "alpha": stats.alpha, "expected": scored}


def summarise(runs: list[dict]) -> dict:
    """Per rule: tau, alpha, s/token, and the pooled E[accepted | block] of both rules over its steps."""
    by_rule = {}
    for rule in VERIFY_RULES:
        rs = [r for r in runs if r["rule"] == rule]
        steps = sum(r["steps"] for r in rs)
        by_rule[rule] = {"runs": len(rs), "steps": steps, "tau": sum(r["emitted"] for r in rs) / steps,
                         "accepted_per_step": sum(r["accepted"] for r in rs) / steps,
                         "s_per_token": sum(r["s"] for r in rs) / sum(r["tokens"] for r in rs)}
    expected = {r: [x for run_ in runs for x in run_["expected"][r]] for r in VERIFY_RULES}
    prompts = sorted({r["id"] for r in runs})

    # cells (prompt, seed): the two rules' runs of that seed.  Expected gain: the expected accepted drafts of every
    # step scored in the cell's two runs, block over token (seconds 1, so bench.paired's ratio is the plain ratio);
    # wall clock: each rule's run, its tokens with its own seconds
    seeds = sorted({r["seed"] for r in runs})
    cell_runs = {p: {s: [r for r in runs if r["id"] == p and r["seed"] == s] for s in seeds} for p in prompts}
    expected_cells = {p: {s: (sum(x for r in rs for x in r["expected"]["block"]), 1.0,
                              sum(x for r in rs for x in r["expected"]["token"]), 1.0) for s, rs in by_seed.items()}
                      for p, by_seed in cell_runs.items()}
    speed_cells = {p: {s: tuple(r[key] for rule in ("block", "token") for r in rs if r["rule"] == rule
                                for key in ("tokens", "s")) for s, rs in by_seed.items()}
                   for p, by_seed in cell_runs.items()}
    e_tok, e_blk = statistics.mean(expected["token"]), statistics.mean(expected["block"])
    return {
        "scored_steps": len(expected["token"]),
        "expected_accepted_per_step": {"token": e_tok, "block": e_blk},
        "expected_gain": paired_task_speedup(expected_cells), "expected_gain_ci": two_level_bootstrap_ci(expected_cells),
        "counted": by_rule,
        "tokens_per_s_block_over_token": paired_task_speedup(speed_cells),
        "tokens_per_s_ratio_ci": two_level_bootstrap_ci(speed_cells),
        "sample": f"{len(prompts)} prompts x {len(seeds)} seeds",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 prompt per style, T = 1 only, 32 tokens, 1 seed")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per style")
    ap.add_argument("--k", type=int, default=4, help="drafts per step")
    ap.add_argument("--temperatures", default="0.7,1.0", help="comma-separated, each > 0 (greedy runs are unchanged)")
    ap.add_argument("--seeds", type=int, default=2, help="sampling seeds per prompt and rule")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    try:
        temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}")
    if not temps or min(temps) <= 0:
        ap.error(f"--temperatures must be > 0 (greedy decoding is the same under both rules), got {args.temperatures!r}")
    if min(args.prompts, args.max_new, args.k, args.seeds, args.threads) < 1:
        ap.error("--prompts, --max-new, --k, --seeds and --threads must be >= 1")
    if args.quick:
        temps, n_per, max_new, seeds = [1.0], 1, min(32, args.max_new), 1
    else:
        n_per, max_new, seeds = args.prompts, args.max_new, args.seeds
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    from specdec_lesson.drafters.pair import load_default_pair

    pair = load_default_pair()
    target, tok, model = pair.target, pair.tokenizer, pair.draft.model
    eos = tok.eos_token_id
    items = {t: [(it["id"], tok(chat(tok, it["text"]), add_special_tokens=False)["input_ids"])
                 for it in task_items(t, n_per)] for t in TASKS}
    run(target, model, items["code"][0][1][:64], 8, args.k, 1.0, 0, "block", eos)  # warm-up: not recorded
    by_temp = {}
    for temp in temps:
        by_task = {}
        for task in TASKS:
            runs = []
            for j, (pid, ids) in enumerate(items[task]):
                for seed in range(seeds):
                    order = VERIFY_RULES if (j + seed) % 2 == 0 else VERIFY_RULES[::-1]  # interleaved, alternating
                    for rule in order:
                        r = run(target, model, ids, max_new, args.k, temp, 1000 * seed + j, rule, eos)
                        runs.append({**r, "id": pid, "seed": seed, "rule": rule})
            res = summarise(runs)
            res["prompts"] = [pid for pid, _ in items[task]]
            by_task[task] = res
            e, c = res["expected_accepted_per_step"], res["counted"]
            print(f"[T={temp} {task}] E[accepted | block] token {e['token']:.3f} block {e['block']:.3f} "
                  f"(x{res['expected_gain']:.3f} {res['expected_gain_ci']}); counted tau token {c['token']['tau']:.2f} "
                  f"block {c['block']['tau']:.2f}; tokens/s block/token {res['tokens_per_s_block_over_token']:.3f}",
                  flush=True)
        by_temp[str(temp)] = by_task
    result = {
        "what": "block vs token-level verification, default pair, draft alone (chain), sampled decoding: "
                "E[accepted drafts | drafted block] of both rules on the same blocks, and counted tau / tokens per s",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "draft_weights": draft_identity(),
        "dispatch": getattr(target, "dispatch_profile", None), "k": args.k, "max_new_tokens": max_new,
        "prompts_per_task": n_per, "seeds": seeds, "quick": args.quick,
        "statistics": "each ratio: bench.paired's median over seeds of the (prompt, seed) cells' pooled ratio, block "
                      f"rule over token rule; interval: {CI_METHOD} (seeds in place of repeats), nominal 95%, below "
                      "nominal with few prompts (interval_coverage.json)",
        "temperatures": by_temp,
    }
    write_results(result, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
